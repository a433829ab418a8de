"""The service's routes, one `APIRouter` per concern (`operations`, `index`, `docs`, `model`, `stylize`, `video`);
`serve.http.app.create_app` includes them.
"""
