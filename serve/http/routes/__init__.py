"""The service's routes, one `APIRouter` per concern; `serve.http.app.create_app` includes them.

- `operations`: /healthz, /readyz and (unless switched off) /metrics
- `model`: /v1/model
- `stylize`: /stylize and /stylize/stream
- `video`: /stylize/video (short clips; `video.include` adds it with its limits)
"""
