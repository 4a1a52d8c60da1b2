"""The live attention explorer (`attnconv explore`): a local page over a run's checkpoint.

    from attnconv.explorer import Explorer, make_server
    server = make_server(Explorer("runs/sa"), port=0)   # 127.0.0.1, a free port
    server.serve_forever()

See `attnconv.explorer.server` for the JSON API; the page lives in `static/`.
"""

from attnconv.explorer.server import MODES, TERMS, BadRequest, Explorer, make_server

__all__ = ["MODES", "TERMS", "BadRequest", "Explorer", "make_server"]
