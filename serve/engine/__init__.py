"""The model side of the service: batching queued jobs and the workers that run them on a pipeline per device
(whose condition cache each API key's rows share only with that key)."""
