"""Small shared pieces with no model in them: atomic writes, device names, the precision policy, coded errors,
optional extras, the one --help formatter, and the process's CPU threads and heap."""
