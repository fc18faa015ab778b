"""The shared ground every area stands on: named errors and their exit codes, processes,
console output, architectures, bounded reads, atomic writes, out-of-memory detection, progress
and the collected local checks. Imports nothing else of torchbuild."""
