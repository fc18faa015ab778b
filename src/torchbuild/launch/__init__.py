"""The host side: where a step runs (the backends: native, Docker, Apptainer), the runner that
chooses and launches it, the batch scheduler, and the host tools (host-check, doctor). Imports
the steps (a native backend runs them in this process) and everything below."""
