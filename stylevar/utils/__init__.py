"""Small shared pieces with no model in them: atomic writes, device and dtype names, the inference precisions'
names, and the one --help formatter."""
