"""`stylevar evaluate`: methods side by side on benchmark triplets, the StyleVAR paper's Table 1 metrics.

For each benchmark (a triplet manifest) `n` seeded rows; every method (`methods`) stylises the same 256 x 256
pairs, scored by `stylevar.metrics` and timed. Writes CSV, Markdown, per-sample JSON lines, grids and charts
(`report`, `charts`). Missing weights stop the run before any work unless `--allow-missing`.
"""
