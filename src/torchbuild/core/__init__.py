"""The shared ground every area stands on: named errors and their exit codes, processes,
console output, architectures, bounded reads, atomic writes, progress and the build log's tee,
and the collected local checks. Imports nothing else of torchbuild."""
