"""What a build hands over: the wheel's manifest, its verification (and the probe run in the
interpreter under test), the install step into a venv, modulefiles, the wheelhouse, pip's
environment and the MPI library check. Imports inputs and core."""
