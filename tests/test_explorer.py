"""`attnconv explore`: the JSON API against the layers' own attention, bad requests, the CLI, the page in Chromium."""

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from fixtures_browser import WIDTHS, chromium_page, overlapping_boxes, playwright, sideways_overflow
from fixtures_runs import TINY, train_tiny_runs

from attnconv.cli import main
from attnconv.data import dataset_info, load_dataset, normalize
from attnconv.errors import AttnconvError
from attnconv.explorer import BadRequest, Explorer, make_server
from attnconv.runs import load_run

_chromium_page, _playwright = chromium_page, playwright  # the names tests/test_learnable.py imports


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2-step runs of a content model, a position-only model and a ResNet on 32 + 12 random images."""
    specs = (("sa-learned-content", TINY), ("sa-quadratic", TINY), ("resnet18", dict(width=2)))
    return train_tiny_runs(tmp_path_factory.mktemp("explorer"), specs, seed=3, epochs=1, max_steps=2)


@pytest.fixture(scope="module")
def servers(runs):
    """The explorer of each attention run, served on a free port in a background thread: model -> base URL."""
    urls, running = {}, []
    for model in ("sa-learned-content", "sa-quadratic"):
        server = make_server(Explorer(runs[model], images=10), port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        running.append(server)
        urls[model] = f"http://127.0.0.1:{server.server_address[1]}"
    yield urls
    for server in running:
        server.shutdown()
        server.server_close()


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _request(base: str, method: str = "GET", path: str = "/", *, host: str | list[str] | None = None,
             body: bytes | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request sent as written (no quoting, no dot-segment removal) to the server at `base`:
    (status, headers, body). host: None sends http.client's own Host header, a string that one,
    a list each of its items (none for [])."""
    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=30)
    try:
        conn.putrequest(method, path, skip_host=host is not None, skip_accept_encoding=True)
        for value in [host] if isinstance(host, str) else host or []:
            conn.putheader("Host", value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def _error_of(status_headers_body: tuple[int, http.client.HTTPMessage, bytes]) -> tuple[int, str]:
    """(status, the JSON body's error message) of a refused request; fails on any other body."""
    status, headers, body = status_headers_body
    assert headers["Content-Type"] == "application/json", (status, headers["Content-Type"], body[:200])
    assert b"Traceback" not in body
    answer = json.loads(body)
    assert list(answer) == ["error"], answer
    return status, answer["error"]


def _reference(run, image: int) -> tuple[list[dict], torch.Tensor]:
    """Each layer's score terms and attention_probs for test image `image`, walking the blocks by hand (no hooks)."""
    model, config = load_run(run)
    test = load_dataset(config.dataset, config.data_dir)[1]
    x = normalize(test.images[image : image + 1], dataset_info(config.dataset))
    terms = []
    with torch.no_grad():
        h = model.tokens(x)  # (1, 7, 7, hidden)
        for block in model.layers:
            x_layer = h.permute(0, 3, 1, 2)  # (1, hidden, 7, 7): what the attention layer sees
            layer = block.attention
            terms.append({**layer.attention_scores(x_layer), "probs": layer.attention_probs(x_layer)})
            h = block(h)
    return terms, test.images[image]


# ------------------------------------------------------------------------------ JSON API


def test_info_describes_the_model_and_its_terms(servers):
    status, info = _get(servers["sa-learned-content"] + "/api/info")
    assert status == 200
    assert (info["model"], info["layers"], info["heads"], info["grid"], info["downsample"]) == \
        ("sa-learned-content", 2, 4, [7, 7], 4)
    assert info["images"] == 10 and info["terms"] == ["combined", "content", "position"]
    assert _get(servers["sa-quadratic"] + "/api/info")[1]["terms"] == ["combined", "position"]


def test_image_endpoint_returns_the_test_images_pixels(runs, servers):
    status, img = _get(servers["sa-quadratic"] + "/api/image/7")
    assert status == 200
    test = load_dataset("fashion-mnist", runs["data"])[1]
    raw = test.images[img["test_index"]]  # (1, 28, 28)
    assert img["label"] == int(test.labels[img["test_index"]])
    assert (img["height"], img["width"], img["channels"]) == (28, 28, 1)
    assert img["pixels"] == raw.reshape(-1).tolist()
    assert img["label_name"] == dataset_info("fashion-mnist").classes[img["label"]]


@pytest.mark.parametrize("model", ["sa-learned-content", "sa-quadratic"])
def test_attention_matches_the_layers_own_scores_and_probabilities(runs, servers, model):
    image, i, j = 4, 2, 5
    terms, _ = _reference(runs[model], _test_index(servers[model], image))
    q = i * 7 + j
    names = ["combined", "content", "position"] if model == "sa-learned-content" else ["combined", "position"]
    for term in names:
        for mode in ("probs", "scores"):
            status, r = _get(f"{servers[model]}/api/attention?image={image}&i={i}&j={j}&mode={mode}&term={term}")
            assert status == 200 and r["layer_numbers"] == [1, 2] and r["grid"] == [7, 7]
            for layer, t in enumerate(terms):
                ref = t[term][0, :, q]  # (heads, 49) over keys
                ref = ref.softmax(-1) if mode == "probs" else ref
                np.testing.assert_allclose(np.array(r["layers"][layer]), ref.numpy(), rtol=0, atol=1e-6)
    # one layer alone, numbered from 1 as on the page; the combined probabilities are the layer's attention_probs
    status, r = _get(f"{servers[model]}/api/attention?image={image}&i={i}&j={j}&layer=2")
    assert status == 200 and r["layer_numbers"] == [2] and len(r["layers"]) == 1
    np.testing.assert_allclose(np.array(r["layers"][0]), terms[1]["probs"][0, :, q].numpy(), rtol=0, atol=1e-6)


def test_attention_depends_on_the_image_for_content_models_only(servers):
    def probs(model, image):
        return _get(f"{servers[model]}/api/attention?image={image}&i=3&j=3")[1]["layers"]

    assert probs("sa-quadratic", 0) == probs("sa-quadratic", 1)
    assert probs("sa-learned-content", 0) != probs("sa-learned-content", 1)


@pytest.mark.parametrize(
    "query, message",
    [
        ("/api/attention?image=0&i=7&j=0", "outside the 7x7 token grid"),
        ("/api/attention?image=0&i=0&j=-1", "outside the 7x7 token grid"),
        ("/api/attention?image=10&i=0&j=0", "image 10 is out of range"),
        ("/api/attention?image=-1&i=0&j=0", "image -1 is out of range"),
        ("/api/attention?image=0&i=1.5&j=0", "i='1.5' is not an integer"),
        ("/api/attention?image=zero&i=1&j=0", "image='zero' is not an integer"),
        ("/api/attention?image=0&i=&j=0", "is not an integer"),
        ("/api/attention?image=0&i=1", "missing parameter 'j'"),
        ("/api/attention?image=0&i=1&j=1&mode=logits", "unknown mode 'logits'"),
        ("/api/attention?image=0&i=1&j=1&term=values", "unknown term 'values'"),
        ("/api/attention?image=0&i=1&j=1&term=content", "position-only"),
        ("/api/attention?image=0&i=1&j=1&layer=3", "layer 3 does not exist; the model has layers 1..2"),
        ("/api/attention?image=0&i=1&j=1&layer=0", "layer 0 does not exist; the model has layers 1..2"),
        ("/api/attention?image=0&i=1&j=1&layer=x", "layer='x' is not an integer"),
        ("/api/attention?image=0&i=1&j=1&head=0", "unknown parameter(s) head"),
        ("/api/attention?image=0&image=1&i=1&j=1", "given 2 times"),
        ("/api/attention?image", "malformed query string"),
        ("/api/image/11", "image 11 is out of range"),
        ("/api/image/first", "is not an integer"),
        ("/api/info?verbose=1", "unknown parameter(s) verbose"),
        # huge numbers are out of range, not errors
        ("/api/attention?image=0&i=99999999999999999999999&j=0", "outside the 7x7 token grid"),
        ("/api/attention?image=99999999999999999999&i=0&j=0", "image 99999999999999999999 is out of range"),
        ("/api/image/99999999999999999999", "image 99999999999999999999 is out of range"),
        ("/api/attention?image=0&i=" + "9" * 5000 + "&j=0", "is not an integer"),  # past int()'s digit limit
        # only ASCII digits: int() alone would take these as 10, 1, 1 and 1
        ("/api/attention?image=0&i=1_0&j=0", "i='1_0' is not an integer"),
        ("/api/attention?image=0&i=%201&j=0", "i=' 1' is not an integer"),
        ("/api/attention?image=0&i=+1&j=0", "i=' 1' is not an integer"),
        ("/api/attention?image=0&i=%D9%A1&j=0", "is not an integer"),  # ARABIC-INDIC DIGIT ONE
        ("/api/attention?image=%ff&i=0&j=0", "is not an integer"),
        ("/api/attention?image=0&i=1&j=1&mode=%00", "unknown mode '\\x00'"),
        ("/api/attention?image=0&i=1&j=1&layer=-1", "layer -1 does not exist"),
        ("/api/image/1_0", "image index '1_0' is not an integer"),
        ("/api/image/%2e%2e", "image index '%2e%2e' is not an integer"),
        ("/api/image/../info", "is not an integer"),
        ("/api/image/1/2", "image index '1/2' is not an integer"),
        ("/api/image/", "image index '' is not an integer"),
        ("/api/image/-1", "image -1 is out of range"),
        ("http://evil.example.com/api/info", "is not a path"),  # absolute-form target: not for an origin server
    ],
)
def test_bad_requests_get_400_and_a_message(servers, query, message):
    base = servers["sa-quadratic"]
    status, error = _error_of(_request(base, "GET", query, host=f"127.0.0.1:{_port(base)}"))
    assert status == 400 and message in error


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "/static/../server.py",  # a file next to static/
        "/static/../../etc/passwd",
        "/static/%2e%2e/server.py",
        "/static/..%2fserver.py",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/static/app.js/../../server.py",
        "/static/./app.js",
        "/static/",
        "/static/app.js%00.html",
        "//etc/passwd",
        "/index.html/",
        "/api/",
        "/api/info/",
    ],
)
def test_paths_outside_the_page_and_the_api_get_404(servers, path):
    response = _request(servers["sa-quadratic"], "GET", path)
    status, error = _error_of(response)
    assert status == 404 and error.startswith("no such page")
    assert b"import" not in response[2] and b"root:" not in response[2]  # no file's contents


def test_unknown_pages_get_404_and_the_server_keeps_serving(servers):
    assert _get(servers["sa-quadratic"] + "/etc/passwd")[0] == 404
    assert _get(servers["sa-quadratic"] + "/api/attention?image=0&i=9&j=9")[0] == 400
    assert _get(servers["sa-quadratic"] + "/api/attention?image=0&i=1&j=1")[0] == 200


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "localhost",
                                  "LocalHost:{port}", "[::1]:{port}", "[::1]"])
def test_loopback_host_names_are_answered(servers, host):
    base = servers["sa-quadratic"]
    status, _, body = _request(base, "GET", "/api/info", host=host.format(port=_port(base)))
    assert status == 200 and json.loads(body)["model"] == "sa-quadratic"
    status, _, body = _request(base, "GET", "/", host=host.format(port=_port(base)))
    assert status == 200 and b"<html" in body.lower()


@pytest.mark.parametrize("host", [
    "evil.example.com", "evil.example.com:{port}",  # DNS rebinding: another site's name resolved to 127.0.0.1
    "127.0.0.1:{other}", "localhost:{other}", "[::1]:{other}",  # loopback, but not this server's port
    "127.0.0.1.evil.example.com:{port}", "localhost.evil.example.com", "localhost.", "127.1:{port}", "::1",
    "localhost:{port}:{port}", "localhost:0{port}", "",
])
@pytest.mark.parametrize("path", ["/api/info", "/api/attention?image=0&i=1&j=1", "/api/image/0", "/"])
def test_other_host_names_get_403_and_no_data(servers, host, path):
    base = servers["sa-quadratic"]
    port = _port(base)
    host = host.format(port=port, other=port + 1 if port < 65535 else port - 1)
    status, error = _error_of(_request(base, "GET", path, host=host))
    assert status == 403 and f"Host {host!r} is not served" in error
    assert _error_of(_request(base, "POST", path, host=host, body=b"{}"))[0] == 403  # before the method


@pytest.mark.parametrize("hosts", [[], ["127.0.0.1", "evil.example.com"], ["localhost", "localhost"]])
def test_no_host_or_several_get_400(servers, hosts):
    status, error = _error_of(_request(servers["sa-quadratic"], "GET", "/api/info", host=hosts))
    assert status == 400 and f"exactly one Host header (got {len(hosts)})" in error


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"])
@pytest.mark.parametrize("path", ["/api/info", "/api/attention?image=0&i=1&j=1", "/", "/nowhere"])
def test_methods_other_than_get_and_head_get_405(servers, method, path):
    response = _request(servers["sa-quadratic"], method, path, body=b'{"image": 0}')
    status, error = _error_of(response)
    assert status == 405 and error == f"method {method} is not allowed: the explorer only reads (GET, HEAD)"
    assert response[1]["Allow"] == "GET, HEAD"
    assert response[1]["Connection"] == "close"  # the body was not read: it must not pass for a next request


def test_unknown_methods_and_malformed_requests_get_json_too(servers):
    base = servers["sa-quadratic"]
    status, error = _error_of(_request(base, "BREW", "/api/info"))
    assert status == 501 and "BREW" in error

    def raw(request: bytes, *, status_line: bool = True) -> tuple[int, str]:
        with socket.create_connection(("127.0.0.1", _port(base)), timeout=30) as sock:
            sock.sendall(request)
            if not status_line:  # no readable HTTP version: http.server answers as HTTP/0.9, the body alone
                return 0, json.loads(sock.makefile("rb").read())["error"]
            response = http.client.HTTPResponse(sock)
            response.begin()
            return _error_of((response.status, response.headers, response.read()))

    host = b"Host: 127.0.0.1\r\n"
    assert raw(b"GET /api/info extra HTTP/1.1\r\n" + host + b"\r\n")[0] == 400
    assert raw(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n" + host + b"\r\n")[0] == 414
    assert raw(b"GET /api/info HTTP/1.1\r\n" + host + b"X: y\r\n" * 101 + b"\r\n")[0] == 431
    assert "Bad request version" in raw(b"GET /api/info HTTP/1.1 extra\r\n\r\n", status_line=False)[1]
    assert _get(base + "/api/info")[0] == 200


def test_head_answers_like_get_without_the_body(servers):
    base = servers["sa-quadratic"]
    for path, status in [("/", 200), ("/static/app.js", 200), ("/api/info", 200), ("/api/image/0", 200),
                         ("/api/image/99", 400), ("/nowhere", 404)]:
        got, head, body = _request(base, "HEAD", path)
        assert (got, body) == (status, b"")
        get_status, get_head, get_body = _request(base, "GET", path)
        assert get_status == status and head["Content-Length"] == get_head["Content-Length"] == str(len(get_body))
        assert head["Content-Type"] == get_head["Content-Type"]
        assert head["Connection"] != "close"  # the connection stays usable


def test_concurrent_requests_each_get_their_own_images_attention(servers):
    """The content model runs under one lock: parallel requests for different images never see each other's inputs."""
    base = servers["sa-learned-content"]
    urls = [f"{base}/api/attention?image={image}&i=2&j=4&term=content" for image in range(4)]
    expected = [_get(url)[1]["layers"] for url in urls]
    assert len({json.dumps(e) for e in expected}) == 4
    results: dict[int, list] = {}

    def fetch(n: int) -> None:
        results[n] = _get(urls[n % 4])[1]["layers"]

    threads = [threading.Thread(target=fetch, args=(n,)) for n in range(48)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == list(range(48))
    assert all(results[n] == expected[n % 4] for n in range(48))


def test_a_failing_forward_leaves_no_hooks_behind(runs, servers, monkeypatch):
    """capture_inputs removes its pre-hooks and restores the training mode whatever the forward does."""
    explorer = Explorer(runs["sa-learned-content"], images=2)
    good = explorer.attention(1, 2, 3)
    blocks = list(explorer.model.layers)

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(blocks[1], "forward", broken)
    explorer.model.train()
    with pytest.raises(RuntimeError, match="out of memory"):
        explorer.layer_inputs(1)
    assert all(not b._forward_pre_hooks for b in blocks) and explorer.model.training
    explorer.model.eval()
    server = make_server(explorer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        status, error = _error_of(_request(base, "GET", "/api/attention?image=1&i=2&j=3"))
        assert status == 500 and error == "RuntimeError: out of memory"
        assert all(not b._forward_pre_hooks for b in blocks)
        monkeypatch.undo()
        assert _get(base + "/api/attention?image=1&i=2&j=3") == (200, good)
    finally:
        server.shutdown()
        server.server_close()


def test_the_page_loads_nothing_from_elsewhere(servers):
    class Links(HTMLParser):
        urls = []

        def handle_starttag(self, tag, attrs):
            self.urls += [v for k, v in attrs if k in ("src", "href")]

    with urllib.request.urlopen(servers["sa-quadratic"] + "/", timeout=30) as r:
        page = r.read().decode()
    parser = Links()
    parser.feed(page)
    assert parser.urls and all(u.startswith(("/static/", "data:")) for u in parser.urls), parser.urls
    for url in parser.urls:
        if url.startswith("/static/"):
            with urllib.request.urlopen(servers["sa-quadratic"] + url, timeout=30) as r:
                assert not re.search(r"https?://", r.read().decode())


def test_a_cnn_run_is_refused_with_one_line(runs, capsys):
    with pytest.raises(AttnconvError, match="no attention layers"):
        Explorer(runs["resnet18"])
    assert main(["explore", str(runs["resnet18"]), "--port", "0", "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert "no attention layers" in err and len(err.strip().splitlines()) == 1
    assert "analyze" not in err  # the words of every command that looks at attention, not of `analyze` alone
    assert main(["explore", str(runs["sa-quadratic"]), "--images", "0", "--no-browser"]) == 2
    assert "--images 0 is out of range" in capsys.readouterr().err


def test_a_busy_port_is_one_clear_error(runs, servers):
    port = int(servers["sa-quadratic"].rsplit(":", 1)[1])
    with pytest.raises(AttnconvError, match=f"^port {port}: cannot listen") as info:
        make_server(Explorer(runs["sa-quadratic"], images=1), port)
    assert info.value.as_flag().endswith("choose another port, or --port 0 for any free one")


@pytest.mark.parametrize("port", ["8080", 80.0, True, None])
def test_a_port_that_is_no_whole_number_names_the_parameter(runs, port):
    """From Python the port is a parameter: a string or a float is an error naming `port` (no `--`), not a
    TypeError from a comparison; True is no port either."""
    explorer = Explorer(runs["sa-quadratic"], images=1)
    with pytest.raises(AttnconvError) as info:
        make_server(explorer, port)
    assert str(info.value) == f"port {port!r} is invalid: give a whole number, a TCP port in 0..65535 (0 picks a free one)"


# A process started in the background by a non-interactive shell (`cmd &`, as test runners
# and CI scripts may be) inherits SIGINT *ignored*, and Python keeps it ignored, so Ctrl-C
# could not reach the child. The wrapper restores what a terminal gives: SIGINT raising
# KeyboardInterrupt.
_AS_IN_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                     "sys.argv[0] = 'attnconv'; runpy.run_module('attnconv', run_name='__main__')")


def test_cli_prints_the_url_and_exits_0_on_ctrl_c(runs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", _AS_IN_A_TERMINAL, "explore", str(runs["sa-quadratic"]),
         "--port", "0", "--no-browser", "--images", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert url and int(url.group(1)) > 0, line + proc.stderr.read()
        status, info = _get(url.group(0) + "api/info")
        assert status == 200 and info["images"] == 3
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # show where it hangs: faulthandler dumps every thread on SIGABRT
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=10)
            pytest.fail("explore did not stop within 30 s of SIGINT; its threads:\n" + proc.stderr.read()[-8000:])
        assert rc == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------ in a browser


def _significant_digits(number: str) -> int:
    """How many significant digits a number as written has ("0.0123" -> 3, "1.20e-5" -> 3, "1230" -> 3)."""
    mantissa = number.lstrip("-").split("e")[0]
    digits = mantissa.replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." not in mantissa else len(digits)


def _max_readout(page, layer: int, head: int) -> tuple[float, tuple[int, int]]:
    """The map's maximum (exact, from data-max) and where it is, checked against its caption: "max V at (r, c)",
    V with 3 significant digits."""
    text = page.text_content(f"#map-{layer}-{head} figcaption")
    m = re.fullmatch(r"max (-?[\d.]+(?:e[+-]\d+)?) at \((\d+), (\d+)\)", text.strip())
    assert m, text
    exact = float(page.get_attribute(f"#map-{layer}-{head}", "data-max"))
    assert _significant_digits(m.group(1)) <= 3 and float(m.group(1)) == pytest.approx(exact, rel=5e-3, abs=1e-12)
    return exact, (int(m.group(2)), int(m.group(3)))


def _test_index(base: str, k: int) -> int:
    """The place in the test set of the explorer's offered image k."""
    return _get(f"{base}/api/image/{k}")[1]["test_index"]


def test_clicking_a_pixel_in_chromium_shows_the_layers_own_attention(runs, servers):
    image, (i, j) = 3, (5, 2)
    with _chromium_page(servers["sa-learned-content"] + "/") as (page, errors):
        page.wait_for_selector('#maps[data-status="ready"][data-image="0"][data-query="3,3"]')
        assert "sa-learned-content" in page.title() and "sa-learned-content" in page.text_content("h1")

        page.click(f"#thumb-{image}")
        box = page.locator("#image").bounding_box()
        page.click("#image", position={"x": (j + 0.5) * box["width"] / 7, "y": (i + 0.5) * box["height"] / 7})
        page.wait_for_selector(f'#maps[data-status="ready"][data-image="{image}"][data-query="{i},{j}"]')
        shown = page.evaluate("window.__lastAttention")
        assert (shown["image"], shown["i"], shown["j"], shown["mode"]) == (image, i, j, "probs")

        terms, _ = _reference(runs["sa-learned-content"], _test_index(servers["sa-learned-content"], image))
        q = i * 7 + j
        for layer, t in enumerate(terms):
            probs = t["probs"][0, :, q]  # (heads, 49): the layer's attention_probs
            np.testing.assert_allclose(np.array(shown["layers"][layer]), probs.numpy(), rtol=0, atol=1e-6)
            for head in range(4):
                value, (r, c) = _max_readout(page, layer, head)
                k = int(probs[head].argmax())
                assert (r, c) == divmod(k, 7)
                assert abs(value - float(probs[head, k])) <= 1e-6
                values = json.loads(page.get_attribute(f"#map-{layer}-{head}", "data-values"))
                np.testing.assert_allclose(values, probs[head].numpy(), rtol=0, atol=1e-6)

        # keyboard: the arrow keys move the query; the scores switch shows pre-softmax values
        page.focus("#image")
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f'#maps[data-status="ready"][data-query="{i},{j + 1}"]')
        page.check('input[name="mode"][value="scores"]')
        page.check('input[name="term"][value="content"]')
        page.wait_for_selector('#maps[data-status="ready"][data-mode="scores"][data-term="content"]')
        shown = page.evaluate("window.__lastAttention")
        content = terms[1]["content"][0, :, i * 7 + j + 1]
        np.testing.assert_allclose(np.array(shown["layers"][1]), content.numpy(), rtol=0, atol=1e-6)
        value, _ = _max_readout(page, 1, 0)
        assert abs(value - float(content[0].max())) <= 1e-6
        assert errors == []


def test_a_converted_cnn_is_explored_layer_by_layer_in_chromium(runs, tmp_path):
    """A CNN converted to attention: each layer's map is its own attention_probs row, on its own grid."""
    from attnconv.runs import convert_run

    run = convert_run(runs["resnet18"], tmp_path / "converted")
    explorer = Explorer(run, images=4)
    info = explorer.info()
    assert info["layers"] == 17 and info["heads"] == 9 and info["grid"] == [28, 28] and info["downsample"] == 1
    assert info["layer_grids"][0] == [28, 28] and info["layer_grids"][-1] == [4, 4]
    # image pixel (20, 9) -> each layer's nearest output pixel; its probabilities over the input grid
    result = explorer.attention(1, 20, 9)
    model, _ = load_run(run)
    for n, (path, layer, size) in enumerate((site.path, site.layer, site.size) for site in explorer.sites):
        oh, ow = layer.output_size(size)
        q = min(oh - 1, 20 * oh // 28) * ow + min(ow - 1, 9 * ow // 28)
        expected = dict(model.named_modules())[path].attention_probs(size=size)[0, :, q]
        np.testing.assert_allclose(result["layers"][n], expected.numpy(), rtol=0, atol=1e-7)
        assert result["grids"][n] == list(size)
        # the middle head (tap (1, 1)) attends to the query's own input pixel
        assert divmod(int(expected[4].argmax()), size[1]) == tuple(result["queries"][n])
    scores = explorer.attention(1, 20, 9, mode="scores", layer=1)["layers"][0]  # layer 1: the first
    assert np.argmax(scores[4]) == 20 * 28 + 9
    with pytest.raises(BadRequest, match="outside the 28x28"):
        explorer.attention(0, 28, 0)

    _playwright()
    server = make_server(explorer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with _chromium_page(f"http://127.0.0.1:{server.server_address[1]}/") as (page, errors):
            page.wait_for_selector('#maps[data-status="ready"][data-image="0"][data-query="14,14"]')
            box = page.locator("#image").bounding_box()
            page.click("#image", position={"x": 9.5 * box["width"] / 28, "y": 20.5 * box["height"] / 28})
            page.wait_for_selector('#maps[data-status="ready"][data-query="20,9"]')
            last = len(info["layer_grids"]) - 1
            for layer in (0, last):
                h, w = info["layer_grids"][layer]
                canvas = page.locator(f"#map-{layer}-4 canvas")
                assert canvas.evaluate("c => c.width / c.height") == pytest.approx(w / h)
                value, (r, c) = _max_readout(page, layer, 4)
                k = int(np.argmax(result["layers"][layer][4]))
                assert (r, c) == divmod(k, w) and abs(value - result["layers"][layer][4][k]) <= 1e-6
            assert f"layer 1 {info['layer_names'][0]}" in page.text_content("#maps")  # numbered from 1
            assert "layer 0" not in page.text_content("#maps")
            assert not errors, errors
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------ heads over training


def test_heads_endpoint_serves_heads_jsonl_with_each_quadratic_heads_ellipses(runs, servers):
    from attnconv.plots import gaussian_ellipse
    from attnconv.runs import read_heads

    for model in ("sa-quadratic", "sa-learned-content"):
        status, body = _get(servers[model] + "/api/heads")
        assert status == 200 and body["grid"] == [7, 7]
        recorded = read_heads(runs[model])
        assert [s["epoch"] for s in body["snapshots"]] == [s["epoch"] for s in recorded] == [0, 1]
        assert _get(servers[model] + "/api/info")[1]["recorded_epochs"] == [0, 1]
        for served, snap in zip(body["snapshots"], recorded):
            for layer_s, layer_r in zip(served["layers"], snap["layers"]):
                assert [h["center"] for h in layer_s] == [h["center"] for h in layer_r]
                for hs, hr in zip(layer_s, layer_r):
                    if model == "sa-quadratic":  # Sigma^-1 = 2 alpha I: circles, at 50% and 90% mass
                        expected = [list(gaussian_ellipse(2 * hr["alpha"] * np.eye(2), m)) for m in (0.5, 0.9)]
                        np.testing.assert_allclose(hs["ellipses"], expected, rtol=1e-12)
                    else:
                        assert hs["ellipses"] is None
    status, error = _error_of(_request(servers["sa-quadratic"], path="/api/heads?epoch=1"))
    assert status == 400 and "epoch" in error


def test_a_run_without_heads_jsonl_is_still_explored(runs, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(runs["sa-quadratic"], old)
    (old / "heads.jsonl").unlink()
    explorer = Explorer(old, images=2)
    assert explorer.heads()["snapshots"] == [] and explorer.info()["recorded_epochs"] == []


def test_stepping_through_the_recorded_epochs_in_chromium(runs, servers):
    from attnconv.runs import read_heads

    recorded = read_heads(runs["sa-quadratic"])
    with _chromium_page(servers["sa-quadratic"] + "/") as (page, errors):
        page.wait_for_selector('#centers[data-status="ready"][data-epoch="1"]')  # the last epoch first
        assert page.text_content("#epoch-readout").startswith("epoch 1 (step 2)")
        assert page.locator("#centers canvas").count() == TINY["layers"]
        shown = page.evaluate("window.__lastHeads")
        assert [[h["center"] for h in layer] for layer in shown["layers"]] == \
            [[h["center"] for h in layer] for layer in recorded[1]["layers"]]
        page.focus("#epoch")
        page.keyboard.press("ArrowLeft")
        page.wait_for_selector('#centers[data-status="ready"][data-epoch="0"]')
        assert "at initialization" in page.text_content("#epoch-readout")
        shown = page.evaluate("window.__lastHeads")
        assert [[h["center"] for h in layer] for layer in shown["layers"]] == \
            [[h["center"] for h in layer] for layer in recorded[0]["layers"]]
        # The last head is drawn on top: the pixel at its center has its colour (tab10, as the figures).
        r, g, b, n = page.evaluate("""() => {
            const heads = window.__lastHeads.layers[0], n = heads.length - 1, [r, c] = heads[n].center;
            const R = state.reach, canvas = document.getElementById('centers-0'), scale = canvas.width / (2 * R + 1);
            const d = canvas.getContext('2d').getImageData(
                Math.floor((c + R + 0.5) * scale), Math.floor((r + R + 0.5) * scale), 1, 1).data;
            return [d[0], d[1], d[2], n]; }""")
        tab10 = ["1f77b4", "ff7f0e", "2ca02c", "d62728", "9467bd", "8c564b", "e377c2", "7f7f7f", "bcbd22", "17becf"]
        assert (r, g, b) == tuple(int(tab10[n][k:k + 2], 16) for k in (0, 2, 4))
        assert errors == []


def test_a_leading_double_slash_is_the_same_page_as_documented(servers):
    """http.server collapses a leading '//' to '/': //api/info is /api/info (docs/failure-model.md says so)."""
    status, _, body = _request(servers["sa-quadratic"], path="//api/info")
    assert status == 200 and json.loads(body) == _get(servers["sa-quadratic"] + "/api/info")[1]
    assert _request(servers["sa-quadratic"], path="//etc/passwd")[0] == 404


# ------------------------------------------------------------------------------ an image folder: sampling, layout


@pytest.fixture(scope="module")
def folder_runs(tmp_path_factory):
    """2-step runs on an image folder listed class by class (3 classes, 4 test images each) at 8x8: an attention
    model, and a ResNet converted to attention, whose last stages see 2x2 and 1x1 grids."""
    from fixtures_runs import train_folder_runs

    from attnconv.runs import convert_run

    root = tmp_path_factory.mktemp("explorer-folder")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
    runs = train_folder_runs(root, [("sa-quadratic", dict(TINY, downsample=2)), ("resnet18", dict(width=2))])
    runs["converted"] = convert_run(runs["resnet18"], root / "converted")
    yield runs
    mp.undo()


@contextlib.contextmanager
def _served(explorer: Explorer):
    server = make_server(explorer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_offered_images_are_sampled_across_the_classes(folder_runs):
    """An image folder lists its test images class by class: the first three would all be "ant"."""
    test = load_dataset(f"folder:{folder_runs['data']}", image_size=8)[1]
    assert test.labels[:4].tolist() == [0, 0, 0, 0]
    explorer = Explorer(folder_runs["sa-quadratic"], images=3)
    assert sorted(explorer.labels) == [0, 1, 2]  # one of each class
    six = Explorer(folder_runs["sa-quadratic"], images=6)
    assert sorted(six.labels) == [0, 0, 1, 1, 2, 2] and six.indices[:3] == explorer.indices  # the same, fixed seed
    for k in range(6):
        img = six.image(k)
        assert img["test_index"] == six.indices[k] and img["label"] == int(test.labels[six.indices[k]])
        assert img["pixels"] == test.images[six.indices[k]].permute(1, 2, 0).reshape(-1).tolist()


def _pixel(page, selector: str, x: float, y: float) -> tuple[int, int, int]:
    """The colour of a canvas at (x, y), in the canvas's own pixels."""
    return tuple(page.evaluate("""([sel, x, y]) => {
        const c = document.querySelector(sel);
        return [...c.getContext('2d').getImageData(Math.floor(x), Math.floor(y), 1, 1).data].slice(0, 3); }""",
                               [selector, x, y]))


def test_maps_with_nothing_to_show_are_grey_and_say_so_in_chromium(folder_runs):
    """A converted ResNet's 1x1 grid: the off-centre heads' taps fall on the padding (no attention on the grid),
    the centre head has the one key; neither is drawn in the colour map's extremes."""
    explorer = Explorer(folder_runs["converted"], images=2)
    info = explorer.info()
    last = len(info["layer_grids"]) - 1
    assert info["layer_grids"][last] == [1, 1] and [2, 2] in info["layer_grids"]
    playwright()
    with _served(explorer) as base, chromium_page(base + "/") as (page, errors):
        page.wait_for_selector('#maps[data-status="ready"]')
        caption = page.text_content(f"#map-{last}-0 figcaption")
        assert caption in ("no attention: all zero", "no attention: all < 1e-6"), caption
        assert page.get_attribute(f"#map-{last}-0", "data-flat") == caption
        assert page.text_content(f"#map-{last}-4 figcaption") == "one key: 1.00"
        side = page.evaluate(f"document.querySelector('#map-{last}-0 canvas').width")
        for head in (0, 4):  # inside the query's outline, which covers the one pixel
            assert _pixel(page, f"#map-{last}-{head} canvas", side / 2, side / 2) == (166, 166, 166)  # neutral
        assert page.text_content("#map-0-4 figcaption").startswith("max 1.00 at ")  # a map with something to show
        assert page.get_attribute("#map-0-4", "data-flat") == ""
        assert _pixel(page, "#map-0-4 canvas", 1, 1) != (166, 166, 166)
        assert "nothing to show" in page.text_content("#legend")
        assert not errors, errors


@pytest.mark.parametrize("which", ["sa-learned-content", "converted"])
def test_the_page_fits_the_window_at_1400_and_800_pixels_in_chromium(runs, servers, folder_runs, which):
    """No sideways scrolling, captions apart, layers and heads numbered from 1, numbers with 3 significant digits."""
    playwright()
    with contextlib.ExitStack() as stack:
        if which == "converted":
            base = stack.enter_context(_served(Explorer(folder_runs["converted"], images=3)))
        else:
            base = servers[which]
        page, errors = stack.enter_context(chromium_page(base + "/", width=WIDTHS[0]))
        page.wait_for_selector('#maps[data-status="ready"]')
        page.wait_for_selector('#centers[data-status="ready"], #centers[data-status="empty"]', state="attached")
        info = page.evaluate("state.info")
        assert [page.text_content(f"#maps .col-label >> nth={h}") for h in range(info["heads"])] == \
            [f"head {h + 1}" for h in range(info["heads"])]
        rows = [page.text_content(f"#maps .row-label >> nth={n}") for n in range(info["layers"])]
        assert [r.split()[:2] for r in rows] == [["layer", str(n + 1)] for n in range(info["layers"])]
        for width in WIDTHS:
            overflow, wide = sideways_overflow(page, width)
            assert overflow <= 0 and wide == [], (width, overflow, wide)
            # every caption, map and label in a box of its own
            assert overlapping_boxes(page, "#maps figcaption, #maps canvas, #maps .row-label, #maps .col-label") == []
        for n in range(info["layers"]):
            for h in range(info["heads"]):
                text = page.text_content(f"#map-{n}-{h} figcaption")
                for number in re.findall(r"-?\d+\.\d+(?:e[+-]\d+)?", text):
                    assert _significant_digits(number) == 3, text
        assert not errors, errors


def test_the_pages_numbers_have_3_significant_digits_as_the_report(servers):
    from attnconv.tables import significant

    values = [0.903312, 0.1, 12.345, 1234.5, 0.99951, 1.234e-5, -0.0312, 0.0, 2.5e7, 1.0, 0.000123456]
    with chromium_page(servers["sa-quadratic"] + "/") as (page, errors):
        page.wait_for_selector('#maps[data-status="ready"]')
        assert page.evaluate("(values) => values.map(fmt)", values) == [significant(v) for v in values]
        assert not errors, errors


def test_layers_with_other_head_counts_are_drawn_each_with_its_own_in_chromium(tmp_path):
    """A converted ViT (patch 2: a 4-head patch layer, then blocks of 6 heads): the page drew every layer with
    the first layer's 4 columns and failed on the fifth head ("Cannot read properties of null"). Every layer's
    heads are drawn, the missing cells left empty, the subtitle says both counts."""
    from attnconv.runs import convert_run

    runs = train_tiny_runs(tmp_path, [("vit", dict(patch=2, hidden=12, heads=6, layers=1, intermediate=8))],
                           epochs=1, max_steps=1)
    explorer = Explorer(convert_run(runs["vit"], tmp_path / "converted"), images=2)
    assert explorer.info()["layer_heads"] == [4, 6] and explorer.info()["heads"] == 6
    _playwright()
    with _served(explorer) as url, _chromium_page(url + "/") as (page, errors):
        page.wait_for_selector('#maps[data-status="ready"]')
        assert page.locator("#map-1-5 canvas").count() == 1 and page.locator("#map-0-3 canvas").count() == 1
        assert page.locator("#map-0-4").count() == 0 and page.locator("#maps .no-head").count() == 2
        assert "4 to 6 heads" in page.text_content("#subtitle")
        assert page.get_attribute("#map-1-5", "data-max") not in (None, "")
        assert errors == []


def test_a_layer_of_many_heads_keeps_its_maps_readable_and_the_page_its_width_in_chromium(tmp_path):
    """A converted ViT of patch 7 has a 49-head patch layer: its 49 columns shared the page's width (about 8 pixels a
    map, captions one character a line), and the subtitle named the first layer's grid only. Each map is at least 48
    pixels wide, the maps' box scrolls sideways (the page does not), and the subtitle names the grids."""
    from attnconv.runs import convert_run

    runs = train_tiny_runs(tmp_path, [("vit", dict(patch=7, hidden=8, heads=2, layers=1, intermediate=8))],
                           epochs=1, max_steps=1)
    explorer = Explorer(convert_run(runs["vit"], tmp_path / "converted"), images=2)
    assert explorer.info()["layer_heads"] == [49, 2]
    _playwright()
    with _served(explorer) as url, _chromium_page(url + "/", width=800) as (page, errors):
        page.wait_for_selector('#maps[data-status="ready"]')
        widths = page.evaluate("[...document.querySelectorAll('#maps figure')].map(f => f.getBoundingClientRect().width)")
        assert len(widths) == 51 and min(widths) >= 47.5, widths
        assert page.evaluate("(m => m.scrollWidth > m.clientWidth)(document.getElementById('maps'))")
        overflow, culprits = sideways_overflow(page, 800)
        assert overflow <= 0, culprits
        assert "grids of 28x28 to 4x4, one per layer" in page.text_content("#subtitle")
        assert errors == []
