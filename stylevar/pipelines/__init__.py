"""Pipelines over the models: `StylePipeline` (images in, images out; video frames through `coherence`) and
the options of one request."""
