"""`stylevar evaluate`: methods side by side on benchmark triplets, the StyleVAR paper's Table 1 metrics.

For each benchmark (a triplet manifest) `n` rows are drawn with the seed; every method stylises the same
256 x 256 pairs, scored by `stylevar.metrics` and timed per image of its own inference.

Methods: model directories or hub ids, `adain`, `adain-paper`, `reinhard` and `magenta` (`methods`). Writes
`results.csv`, `results.md`, `per_sample.jsonl`, sample grids and one chart per metric (`report`, `charts`).
Missing weights stop the run before any work unless `--allow-missing`, which marks what they would give `missing`.
"""
