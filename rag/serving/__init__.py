"""Serving: the HTTP API and web page (`rag serve`) over an answerer and the feedback store.

rag.serving.app (create_app), rag.serving.settings (ServeSettings), rag.serving.index (the serving replica),
rag.serving.server (the production app, uvicorn), rag.serving.cli (`rag serve`).
"""
