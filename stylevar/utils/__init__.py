"""Small shared pieces with no model in them: atomic writes, device and dtype names, the inference precisions'
names, the one --help formatter, and torch's CPU threads (the CPUs the process may use, the one policy)."""
