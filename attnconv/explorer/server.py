"""The live attention explorer: a local web page over a run's checkpoint.

    attnconv explore runs/sa                 opens http://127.0.0.1:8765/
    attnconv explore runs/sa --port 0 --no-browser

Pick one of N test images (sampled across the classes with a fixed seed, so every class
shows up: `runs.run_data.sample_across_classes`), then click (or hover, or move with the arrow
keys) a query pixel on it: the page shows, for every layer and head, that query's
attention over the token grid. Coordinates are token-grid coordinates (the image after
the model's d x d downsampling, image_size // d tokens a side), (row, column), rows down,
counted from 0; layers and heads are numbered from 1, as in the paper and the figures.
Numbers are shown with 3 significant digits; a map with nothing to show (no attention on
the grid, or one value everywhere: a converted CNN's 1x1 and 2x2 grids) is drawn grey and
captioned so (`plots.flat_map_label`'s rules). The page fits its window from 800 pixels
wide up without scrolling sideways: the maps shrink to fit.

Nothing is precomputed but what cannot change: each request runs the model on the chosen
image, captures every attention layer's input with forward pre-hooks, and asks each layer
for its attention on it (`models.sites.site_maps`: `attention_scores`, and `attention_probs`,
which for a padded layer folds the padding keys onto the pixels they copy); a model whose
attention is captured (the ViT: `models.capture`) gives its scores over the image positions
from that one pass, a class token left out, with the terms combined and content (q.k).
Position-only layers' probabilities are the same for every image: kept once computed.
`mode=scores` returns the pre-softmax term (Eq. 6); `mode=probs` its probabilities, which for
`term=combined` are the layer's actual attention. Content models also offer the content
(q.k) and positional (q.r) terms alone; position-only models have one term (combined =
position). Every network goes through this one path: when its layers have grids of their
own (a network converted from a CNN), the query is an image pixel and each layer answers
for its nearest output pixel (`query_on_site`), with "grids" and "queries" in the answer.

JSON API (every response is JSON; bad parameters get HTTP 400 and {"error": message}):

    GET /api/info                  run, model, dataset, layers, heads (the most of any layer; layer_heads
                                   per layer where they differ), grid, downsample, image size, images,
                                   modes, terms
    GET /api/image/K               offered image K (0..N-1): test_index (its place in the test set, as
                                   `attnconv plot maps --image`), height, width, channels, pixels (row-major
                                   H x W x C uint8), label, class name, predicted class and its probability
    GET /api/attention?image=K&i=I&j=J[&mode=probs|scores][&term=combined|content|position][&layer=L]
                                   {"layers": [[heads x (H*W) numbers]], "layer_numbers": [...], ...}:
                                   row-major over the keys, one list per layer (all layers, or layer L,
                                   numbered from 1); "layer_numbers" says which
    GET /api/heads                 the heads recorded during training (heads.jsonl): {"snapshots": [{epoch,
                                   step, layers: [[{center, attention_distance, ellipses}]]}]}, ellipses
                                   [[semi-major, semi-minor, angle] at 50% and 90% mass] for quadratic
                                   heads, else null; [] for a run without heads.jsonl

The server binds 127.0.0.1 only and serves its own page and script (no external assets,
works offline). It answers only requests whose Host header is a loopback name (127.0.0.1,
localhost or [::1], with or without the port it serves): anything else gets 403, so a
page elsewhere cannot read it by rebinding its own name to 127.0.0.1. GET and HEAD only:
POST, PUT, DELETE, PATCH, OPTIONS, TRACE and CONNECT get 405 with `Allow: GET, HEAD`,
unknown methods 501. Static files are looked up by their exact path (no decoding, no
"..": anything else is a 404).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

import torch

from attnconv.errors import AttnconvError, ParameterError
from attnconv.fileio import not_a_folder
from attnconv.limits import path_argument, whole_number
from attnconv.models.sites import query_on_site, site_inputs, site_maps, site_terms
from attnconv.plots import MASSES, gaussian_ellipse, snapshot_geometry
from attnconv.runs import Run
from attnconv.tables import one_line

__all__ = ["MODES", "TERMS", "BadRequest", "Explorer", "make_server"]

MODES = ("probs", "scores")
TERMS = ("combined", "content", "position")
_STATIC = {  # URL path -> (file under explorer/static, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}


class BadRequest(ValueError):
    """A request the client got wrong (answered with HTTP 400 and the message)."""


class Explorer:
    """A run's model and `images` of its test images (sampled across the classes), answering the explorer's API.

    Raises AttnconvError for a run without attention layers (a CNN) or a dataset that
    cannot be found. Every network is answered the same way (`models.sites`): each layer's
    maps on its own grid, the query mapped onto it by `query_on_site`. When the layers share
    one grid (a classifier's tokens) the query is on that grid; when they have grids of their
    own (a network converted from a CNN: `attnconv convert`, `train --init-from`) it is an
    image pixel, mapped to the nearest output pixel of each (possibly strided) layer.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        images: int = 32,
        data_dir: str | os.PathLike | None = None,
        dataset: str | None = None,
        device: str = "cpu",
    ):
        images = whole_number(images, "images", "a number of test images")
        self.run_dir = path_argument(run_dir, "run_dir", "the run's directory")
        why = not_a_folder(self.run_dir)
        if why:
            raise AttnconvError(f"{run_dir}: not a run directory ({why}); give the --out of `attnconv train`")
        run = Run(self.run_dir, device, data_dir=data_dir, dataset=dataset)
        self.model, self.config, self.info_ = run.model, run.config, run.info
        self.sites = run.sites  # refuses CNN runs
        self.layers = [site.layer for site in self.sites]
        self.device = device
        # Across the classes (an image folder lists its test images class by class), the same images every time.
        self.indices = run.test_sample(images)  # each offered image's place in the test set
        # uint8 (N, C, H_img, W_img); normalized as trained, kept on the CPU (one image at a time goes to the device)
        self.raw, self.x = run.test_images(images, device="cpu")
        self.labels = run.test_set.labels[self.indices].tolist()
        # The query pixel's grid: the one every layer attends over (a classifier's token grid), else the image's
        # pixels, each mapped to the nearest query of every (possibly strided) layer by query_on_site.
        shared = _shared_grid(self.sites)
        self.grid = shared or (int(self.raw.shape[2]), int(self.raw.shape[3]))
        # Layers on grids of their own (a network converted from a CNN): the page labels each and draws it on its grid.
        self.own_grids = shared is None
        self._kept: dict[tuple[int, str], torch.Tensor] = {}  # position-only layers' probabilities: any image
        self.snapshots = _heads_over_training(run)
        have = {t for site in self.sites for t in site_terms(site)}
        self.terms = tuple(t for t in TERMS if t in have)
        self.title = f"{self.run_dir.resolve().name} ({self.config.model} on {self.info_.name})"
        # One request at a time runs the model: the forward hooks below are per call.
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ API
    def info(self) -> dict[str, Any]:
        counts = [layer.heads for layer in self.layers]
        heads = max(counts)  # the page's columns; a layer with fewer heads leaves the rest of its row empty
        extra = {}
        if self.own_grids:  # each layer's name and input grid, for the page's labels and maps
            extra = {"layer_names": [one_line(site.path) for site in self.sites],
                     "layer_grids": [list(site.size) for site in self.sites]}
        if len(set(counts)) > 1:  # a converted ViT: its patch layer's heads, then its blocks'
            extra["layer_heads"] = counts
        names = list(dict.fromkeys(_encoding_name(layer) for layer in self.layers))
        return {  # names shown in the page: escaped as the command line shows them (`tables.one_line`)
            "title": one_line(self.title),
            "run": one_line(self.run_dir.resolve().name),
            "model": self.config.model,
            "dataset": one_line(self.info_.name),
            "encoding": ", ".join(names),
            "layers": len(self.layers),
            "heads": heads,
            "grid": list(self.grid),
            **extra,
            "downsample": int(self.raw.shape[2]) // self.grid[0],  # image pixels per query-grid cell a side
            "image_size": [int(self.raw.shape[2]), int(self.raw.shape[3])],
            "channels": int(self.raw.shape[1]),
            "images": len(self.raw),
            "sampled": "across the classes",
            "modes": list(MODES),
            "terms": list(self.terms),
            "classes": [one_line(c) for c in self.info_.classes],
            "recorded_epochs": [s["epoch"] for s in self.snapshots],
        }

    def heads(self) -> dict[str, Any]:
        """The heads recorded during training, with each quadratic head's 50% / 90% ellipses."""
        return {"grid": list(self.grid), "snapshots": self.snapshots}

    def image(self, k: int) -> dict[str, Any]:
        k = self._image_index(k)
        with self._lock, torch.no_grad():
            p = self.model(self.x[k : k + 1].to(self.device)).float().softmax(-1)[0]
        pred = int(p.argmax())
        img = self.raw[k].permute(1, 2, 0)  # (H, W, C)
        return {
            "index": k,
            "test_index": self.indices[k],
            "height": int(img.shape[0]),
            "width": int(img.shape[1]),
            "channels": int(img.shape[2]),
            "pixels": img.reshape(-1).tolist(),
            "label": self.labels[k],
            "label_name": self.info_.classes[self.labels[k]],
            "predicted": pred,
            "predicted_name": self.info_.classes[pred],
            "predicted_prob": float(p[pred]),
        }

    def layer_inputs(self, k: int) -> list:
        """Every attention layer's input for test image k, (1, C, H, W) each, captured by forward pre-hooks."""
        k = self._image_index(k)
        with self._lock:
            return site_inputs(self.model, self.sites, self.x[k : k + 1].to(self.device))

    def attention(self, image: int, i: int, j: int, mode: str = "probs", term: str = "combined",
                  layer: int | None = None) -> dict[str, Any]:
        """Query (i, j)'s attention over the token grid, per layer and head, for offered image `image`.

        layer: one layer, numbered from 1 (as on the page); None: all of them."""
        H, W = self.grid
        if not (0 <= i < H and 0 <= j < W):
            raise BadRequest(f"query pixel ({i}, {j}) is outside the {H}x{W} token grid "
                             f"(i in 0..{H - 1}, j in 0..{W - 1}; coordinates are after downsampling)")
        self._check_values(mode, term)
        if layer is not None and not 1 <= layer <= len(self.layers):
            raise BadRequest(f"layer {layer} does not exist; the model has layers 1..{len(self.layers)} "
                             "(numbered from 1)")
        self._image_index(image)
        wanted = range(len(self.layers)) if layer is None else [layer - 1]  # positions in self.layers
        out, grids, queries = [], [], []
        for n, values in zip(wanted, self._maps(image, mode, term, wanted)):
            q, pos = query_on_site(self.sites[n], self.grid, i, j)  # pos: that query on the layer's input grid
            out.append(values[:, q].tolist())  # (heads, T_in) over the keys
            grids.append(list(self.sites[n].size))
            queries.append(list(pos))
        where = {"grids": grids, "queries": queries} if self.own_grids else {}
        return {"image": image, "i": i, "j": j, "mode": mode, "term": term, "grid": [H, W], **where,
                "layer_numbers": [n + 1 for n in wanted], "layers": _finite(out)}

    @property
    def position_only(self) -> bool:
        """Whether every layer's attention depends on positions alone: the same maps for every image."""
        return all(getattr(layer, "position_only", False) is True for layer in self.layers)

    def attention_maps(self, image: int, mode: str = "probs", term: str = "combined") -> list[torch.Tensor]:
        """Every query's attention for offered image `image`, per layer (heads, T_out queries, T_in keys), float32
        on the CPU: what /api/attention answers one query row at a time (the row `query_on_site` names; on a
        shared grid, q = i * W + j)."""
        self._check_values(mode, term)
        return self._maps(self._image_index(image), mode, term, range(len(self.layers)))

    def _maps(self, image: int, mode: str, term: str, wanted) -> list[torch.Tensor]:
        """Layers `wanted` (positions in self.layers): (heads, T_out, T_in) each, from one forward on image
        `image` (`models.sites.site_maps`); NaN for a term a layer does not have. Position-only layers'
        probabilities do not depend on the image: computed once, kept (their one term, combined = position)."""
        keys = {n: self._key(n, mode, term) for n in wanted}
        kept = {n: self._kept.get(keys[n]) for n in wanted}
        todo = [n for n in wanted if kept[n] is None]
        if todo:
            with self._lock:  # captured inputs and hooks are per call: one forward at a time
                found = site_maps(self.model, [self.sites[n] for n in todo],
                                  self.x[image : image + 1].to(self.device), mode=mode, term=term)
            for n, values in zip(todo, found):
                site = self.sites[n]
                if values is None:  # no such term in this layer (a position-only layer's content term): null
                    values = torch.full((site.layer.heads, math.prod(_output_grid(site)), math.prod(site.size)),
                                        math.nan)
                kept[n] = values.float().cpu()
                if keys[n] is not None:
                    self._kept[keys[n]] = kept[n]
        return [kept[n] for n in wanted]

    def _key(self, n: int, mode: str, term: str) -> tuple[int, str] | None:
        """Where layer n's maps are kept: position-only probabilities (one term, combined = position, the same
        for every image); None for maps that depend on the image, scores (cheap) and terms the layer lacks."""
        site = self.sites[n]
        if mode == "probs" and site.position_only and term in site_terms(site):
            return (n, "combined")
        return None

    # ------------------------------------------------------------------------------ helpers
    def _check_values(self, mode: str, term: str) -> None:
        if mode not in MODES:
            raise BadRequest(f"unknown mode {mode!r}; choose one of: {', '.join(MODES)}")
        if term not in self.terms:
            why = " (this model has position-only attention)" if term in TERMS else ""
            raise BadRequest(f"unknown term {term!r}{why}; choose one of: {', '.join(self.terms)}")

    def _image_index(self, k: int) -> int:
        if not 0 <= k < len(self.raw):
            raise BadRequest(f"image {k} is out of range: the explorer offers images 0..{len(self.raw) - 1} "
                             "(sampled from the test set; /api/image/K gives each one's test_index)")
        return k


def _output_grid(site) -> tuple[int, int]:
    """The grid of a site's queries: its input grid, or fewer pixels for a strided layer."""
    size = site.layer.output_size(site.size) if hasattr(site.layer, "output_size") else site.size
    return int(size[0]), int(size[1])


def _shared_grid(sites) -> tuple[int, int] | None:
    """The one grid every site's queries and keys lie on, or None when the layers have grids of their own."""
    grids = {grid for site in sites for grid in (tuple(site.size), _output_grid(site))}
    return next(iter(grids)) if len(grids) == 1 else None


def _encoding_name(layer) -> str:
    """A layer's encoding as the page names it: its own `encoding_name`, or, for Theorem 1's layers, which have
    none, the construction (with content attention when the layer has it)."""
    name = getattr(layer, "encoding_name", None)
    if name is not None:
        return name
    return "converted convolution" if layer.position_only else "converted convolution + content"


def _heads_over_training(run: Run) -> list[dict[str, Any]]:
    """heads.jsonl with the contours the page draws: per head its center, attention distance and ellipses."""
    out = []
    for snap in run.heads:
        layers = []
        for heads in snap["layers"]:
            s = snapshot_geometry(heads)["inverse_covariance"]
            layers.append([{
                "center": h["center"],
                "attention_distance": h["attention_distance"],
                "ellipses": None if s is None else [list(gaussian_ellipse(s[n], m)) for m in MASSES],
            } for n, h in enumerate(heads)])
        out.append({"epoch": snap["epoch"], "step": snap["step"], "layers": layers})
    return out


def _finite(values: list) -> list:
    """Non-finite values to None (JSON has neither infinities nor NaN): a masked encoding's -inf scores,
    and the NaN that stands for a term the layer does not have."""
    return [[[v if math.isfinite(v) else None for v in head] for head in layer] for layer in values]


# ---------------------------------------------------------------------------------- HTTP


_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only: int() would also take " 1", "1_0" and other scripts' digits
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_ALLOW = "GET, HEAD"


def _integer(text: str, what: str) -> int:
    """`text` as an integer, or BadRequest naming `what`."""
    try:
        if _INTEGER.fullmatch(text):
            return int(text)
    except ValueError:  # more digits than int() converts from text (sys.get_int_max_str_digits)
        pass
    raise BadRequest(f"{what}{text!r} is not an integer")


def _int(params: dict[str, list[str]], name: str, default: int | None = None) -> int | None:
    if name not in params:
        if default is None:
            raise BadRequest(f"missing parameter {name!r}")
        return default
    return _integer(params[name][0], f"parameter {name}=")


def _str(params: dict[str, list[str]], name: str, default: str) -> str:
    return params[name][0] if name in params else default


class _Handler(BaseHTTPRequestHandler):
    """GET (and HEAD) of the page and the API, for loopback Host names only; every answer is JSON
    except the static files. Other methods get 405, unknown ones and malformed requests
    http.server's own status, all with a JSON {"error": message} body."""

    explorer: Explorer  # set on the subclass made by make_server
    server_version = "attnconv-explorer"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._reply(*self._answer())

    do_HEAD = do_GET  # noqa: N815 (the same status and headers; _reply leaves the body out)

    def _not_allowed(self) -> None:
        self._reply(*self._answer(allowed=False))

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed  # noqa: N815

    def _answer(self, allowed: bool = True) -> tuple[int, bytes, str, dict[str, str]]:
        """(status, body, content type, extra headers) for the request: Host, then method, then route."""
        refused = self._check_host()
        if refused is not None:
            return refused
        if not allowed:
            return _error(HTTPStatus.METHOD_NOT_ALLOWED,
                          f"method {self.command} is not allowed: the explorer only reads ({_ALLOW})",
                          {"Allow": _ALLOW})
        try:
            return (*self._route(), {})
        except BadRequest as err:
            return _error(HTTPStatus.BAD_REQUEST, str(err))
        except Exception as err:  # never let a request take the server down; say what broke
            print(f"explorer: {self.path}: {type(err).__name__}: {err}", file=sys.stderr)
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(err).__name__}: {err}")

    def _check_host(self) -> tuple[int, bytes, str, dict[str, str]] | None:
        """None for a loopback Host header naming the port served; else the refusal.

        A page on another site can make the browser resolve its own name to 127.0.0.1 (DNS
        rebinding) and then read this server as same-origin; such requests carry that
        site's name in Host, so only loopback names are answered."""
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1:
            return _error(HTTPStatus.BAD_REQUEST, f"a request needs exactly one Host header (got {len(hosts)})")
        port = self.server.server_address[1]
        if hosts[0].strip().lower() not in {f"{h}{p}" for h in _LOOPBACK_HOSTS for p in ("", f":{port}")}:
            return _error(HTTPStatus.FORBIDDEN,
                          f"Host {hosts[0]!r} is not served: the explorer answers only "
                          f"{', '.join(_LOOPBACK_HOSTS)} (optionally with :{port}); open http://127.0.0.1:{port}/")
        return None

    def _reply(self, status: int, body: bytes, ctype: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers.items():
            self.send_header(name, value)
        if self._has_body():  # never read: close, so that it is not taken for the next request
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the page dropped a request it no longer wants (a newer query)

    def _has_body(self) -> bool:
        return "Transfer-Encoding" in self.headers or self.headers.get("Content-Length", "0").strip() not in ("", "0")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (malformed request line or headers, a request line too long, an
        unknown method) with a JSON body like every other answer, and the connection closed."""
        message = message or self.responses.get(code, ("error",))[0]
        self.log_error("code %d, message %s", code, message)
        body = _json({"error": message})
        self.send_response(code)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _route(self) -> tuple[int, bytes, str]:
        # The request target as sent, neither percent-decoded nor normalized: static files are
        # looked up by exact path, so "..", "%2e%2e" and the like can only miss (404).
        target = self.path.split("#", 1)[0]
        if not target.startswith("/"):
            raise BadRequest(f"request target {target!r} is not a path")
        path, _, query = target.partition("?")
        try:
            params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
        except ValueError:
            raise BadRequest(f"malformed query string {query!r}") from None
        for name, values in params.items():
            if len(values) > 1:
                raise BadRequest(f"parameter {name!r} is given {len(values)} times")
        ex = self.explorer
        if path in _STATIC:
            name, ctype = _STATIC[path]
            return HTTPStatus.OK, resources.files("attnconv.explorer").joinpath("static", name).read_bytes(), ctype
        if path == "/api/info":
            self._only(params, set())
            return HTTPStatus.OK, _json(ex.info()), "application/json"
        if path.startswith("/api/image/"):
            self._only(params, set())
            k = _integer(path[len("/api/image/"):], "image index ")
            return HTTPStatus.OK, _json(ex.image(k)), "application/json"
        if path == "/api/heads":
            self._only(params, set())
            return HTTPStatus.OK, _json(ex.heads()), "application/json"
        if path == "/api/attention":
            self._only(params, {"image", "i", "j", "mode", "term", "layer"})
            layer = _int(params, "layer") if "layer" in params else None
            result = ex.attention(_int(params, "image"), _int(params, "i"), _int(params, "j"),
                                  _str(params, "mode", "probs"), _str(params, "term", "combined"), layer)
            return HTTPStatus.OK, _json(result), "application/json"
        return HTTPStatus.NOT_FOUND, _json({"error": f"no such page {path!r}; the API is under /api/"}), \
            "application/json"

    @staticmethod
    def _only(params: dict[str, list[str]], allowed: set[str]) -> None:
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise BadRequest(f"unknown parameter(s) {', '.join(unknown)}"
                             + (f"; allowed: {', '.join(sorted(allowed))}" if allowed else ""))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        pass  # quiet: one line per request would drown the URL the user needs


def _json(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=False).encode()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, str, dict[str, str]]:
    return status, _json({"error": message}), "application/json", headers or {}


def make_server(explorer: Explorer, port: int = 0) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer for `explorer` on 127.0.0.1:`port` (0: a free port); call serve_forever().

    It answers requests whose Host header is a loopback name (127.0.0.1, localhost, [::1],
    with or without its port) and GET/HEAD only; see `_Handler`."""
    if not isinstance(port, int) or isinstance(port, bool):
        raise ParameterError("port", port, "is invalid: give a whole number, a TCP port in 0..65535 (0 picks a free "
                             "one)", shown=repr(port))
    if not 0 <= port <= 65535:
        raise ParameterError("port", port, "is invalid: give a TCP port in 0..65535 (0 picks a free one)")
    handler = type("Handler", (_Handler,), {"explorer": explorer})
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as err:
        raise ParameterError("port", port, f": cannot listen on 127.0.0.1 ({err.strerror or err}); "
                             "choose another port, or {port} 0 for any free one", mentions=("port",)) from None
    server.daemon_threads = True
    return server
