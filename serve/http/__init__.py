"""The HTTP side of the service: the FastAPI app, its routes, request/response models, errors, access,
logging, metrics, drain and the edges where images are decoded and encoded."""
