"""The model side of the service: batching queued jobs, the workers that run them on a pipeline per
device, and the cache of reference-image conditions."""
