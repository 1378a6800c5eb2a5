"""Serving: the HTTP API and web page (`rag serve`) over an answerer and the feedback store."""
from rag.serving.app import AskRequest, AskResponse, create_app, model_version
from rag.serving.settings import ServeSettings

__all__ = ["create_app", "ServeSettings", "AskRequest", "AskResponse", "model_version"]
