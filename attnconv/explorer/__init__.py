"""The attention explorer (`attnconv explore`): a local page over a run's checkpoint, or one self-contained file.

    from attnconv.explorer import Explorer, make_server, write_export
    server = make_server(Explorer("runs/sa"), port=0)   # 127.0.0.1, a free port
    server.serve_forever()
    write_export("runs/sa", "sa.html", images=32)      # the same page, no server: data inside

See `attnconv.explorer.server` for the JSON API and `attnconv.explorer.export` for the
exported file; the page lives in `static/`.
"""

from attnconv.explorer.export import build_export, write_export
from attnconv.explorer.server import MODES, TERMS, BadRequest, Explorer, make_server

__all__ = ["MODES", "TERMS", "BadRequest", "Explorer", "build_export", "make_server", "write_export"]
