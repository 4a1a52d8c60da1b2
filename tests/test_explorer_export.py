"""`attnconv explore --export`: the exported page's data against the live explorer, its size, writing it, and the
page itself in Chromium from file:// (no request leaves it)."""

import base64
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from fixtures_browser import WIDTHS, chromium_page, sideways_overflow
from fixtures_runs import TINY, train_tiny_runs

from attnconv.cli import main
from attnconv.errors import AttnconvError
from attnconv.explorer import Explorer, write_export
from attnconv.explorer import export as export_module
from attnconv.explorer.export import FORMAT, export_data
from attnconv.fileio import written_by_attnconv


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2-step runs of a content model and a position-only model (2 layers x 4 heads, 7x7 tokens), and a ResNet."""
    specs = (("sa-learned-content", TINY), ("sa-quadratic", TINY), ("resnet18", dict(width=2)))
    return train_tiny_runs(tmp_path_factory.mktemp("export"), specs, seed=5, epochs=1, max_steps=2)


@pytest.fixture(scope="module")
def explorers(runs):
    return {model: Explorer(runs[model], images=6) for model in ("sa-learned-content", "sa-quadratic")}


@pytest.fixture(scope="module")
def pages(runs, tmp_path_factory):
    """Each attention run exported with 6 images: model -> the page's path."""
    out = tmp_path_factory.mktemp("pages")
    return {model: write_export(runs[model], out / f"{model}.html", images=6)
            for model in ("sa-learned-content", "sa-quadratic")}


def _decode(map_set: dict, shape: list[int]) -> np.ndarray:
    """A stored map set back to probabilities (layers, heads, T, T), as the page reads it."""
    fractions = np.frombuffer(base64.b64decode(map_set["fractions"]), np.uint8).reshape(shape)
    maxima = np.frombuffer(base64.b64decode(map_set["maxima"]), "<f4").reshape(shape[:-1])
    return fractions / 255 * maxima[..., None].astype(np.float64)


def _embedded(path) -> dict:
    """The data blob of an exported page."""
    text = path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="attnconv-data">(.*?)</script>', text, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def _close_to(stored: np.ndarray, exact: np.ndarray) -> None:
    """Stored values are within 1/510 of their row's maximum of the exact ones; the maximum itself is exact."""
    exact = np.asarray(exact, dtype=np.float64)
    top = exact.max(-1, keepdims=True)
    assert np.all(np.abs(stored - exact) <= top / 510 + 1e-7)
    np.testing.assert_allclose(stored.max(-1), exact.max(-1), rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------ what is stored


def test_attention_maps_are_the_rows_the_api_answers(explorers):
    """Every query's maps come from the code that answers /api/attention: row q is the answer for query q."""
    gen = torch.Generator().manual_seed(0)
    for explorer in explorers.values():
        for _ in range(4):
            k, i, j = (int(torch.randint(n, (1,), generator=gen)) for n in (6, 7, 7))
            maps = explorer.attention_maps(k)
            answer = explorer.attention(k, i, j)
            assert [m.shape for m in maps] == [(4, 49, 49)] * 2
            for layer, m in enumerate(maps):
                assert m[:, i * 7 + j].tolist() == answer["layers"][layer]


def test_a_position_only_run_stores_one_map_set_for_every_image(explorers):
    explorer = explorers["sa-quadratic"]
    assert explorer.position_only
    data = export_data(explorer)
    assert data["format"] == FORMAT and data["maps"]["per_image"] is False and len(data["maps"]["sets"]) == 1
    stored = _decode(data["maps"]["sets"][0], data["maps"]["shape"])  # (layers, heads, 49, 49)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):  # the one set answers for any image and query as the live explorer does
        k, i, j = (int(torch.randint(n, (1,), generator=gen)) for n in (6, 7, 7))
        live = np.array(explorer.attention(k, i, j)["layers"])  # (layers, heads, 49)
        _close_to(stored[:, :, i * 7 + j], live)
    assert len(data["images"]) == 6 and data["info"]["images"] == 6


def test_a_content_run_stores_a_map_set_per_image(explorers):
    explorer = explorers["sa-learned-content"]
    assert not explorer.position_only
    data = export_data(explorer)
    sets = data["maps"]["sets"]
    assert data["maps"]["per_image"] is True and len(sets) == 6
    decoded = [_decode(s, data["maps"]["shape"]) for s in sets]
    for k in range(6):
        live = torch.stack(explorer.attention_maps(k)).numpy()  # (layers, heads, 49, 49)
        _close_to(decoded[k], live)
    assert not np.allclose(decoded[0], decoded[1])  # the attention depends on the image


def test_images_heads_and_info_are_the_apis_answers(explorers):
    explorer = explorers["sa-learned-content"]
    data = export_data(explorer)
    for k, image in enumerate(data["images"]):
        live = explorer.image(k)
        pixels = list(base64.b64decode(image.pop("pixels")))
        assert pixels == live.pop("pixels") and image == live
    assert data["heads"] == json.loads(json.dumps(explorer.heads()))
    assert [s["epoch"] for s in data["heads"]["snapshots"]] == [0, 1]
    info = data["info"]
    assert (info["modes"], info["terms"]) == (["probs"], ["combined"])  # what the page holds
    assert {k: v for k, v in info.items() if k not in ("modes", "terms", "note", "exported")} == \
        {k: v for k, v in explorer.info().items() if k not in ("modes", "terms")}


@pytest.mark.parametrize("seed", range(3))
def test_quantization_keeps_each_rows_maximum_and_1_in_510_of_it(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, keys = int(torch.randint(1, 20, (1,), generator=gen)), int(torch.randint(1, 60, (1,), generator=gen))
    probs = (torch.randn(3, rows, keys, generator=gen) * 4).softmax(-1)
    probs[0, 0] = 0.0  # no attention on the grid
    probs[1, 0, 0] = float("nan")  # a row without values
    stored = export_module._quantize(probs)
    decoded = _decode(stored, [3, rows, keys])
    assert np.isnan(decoded[1, 0]).all() and (decoded[0, 0] == 0).all()
    ok = np.ones((3, rows), bool)
    ok[1, 0] = ok[0, 0] = False
    _close_to(decoded[ok], probs.double().numpy()[ok])


def test_the_page_holds_what_it_needs_and_names_its_maker(pages, explorers):
    text = pages["sa-learned-content"].read_text(encoding="utf-8")
    assert written_by_attnconv(pages["sa-learned-content"])

    class Tags(HTMLParser):
        links, scripts, policy = [], [], None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            self.links += [v for k, v in attrs if k in ("src", "href")]
            if tag == "script":
                self.scripts.append(a.get("type"))
            if a.get("http-equiv") == "Content-Security-Policy":
                self.policy = a["content"]

    tags = Tags()
    tags.feed(text)
    assert tags.links == ["data:,"]  # the empty favicon: nothing to load
    assert tags.scripts == ["application/json", None]  # the data, then the page's script inline
    assert "default-src 'none'" in tags.policy and "'unsafe-inline'" not in tags.policy
    assert "/api/" not in text.split('id="attnconv-data"')[0]  # no stylesheet or script fetched
    assert _embedded(pages["sa-learned-content"])["info"]["run"] == "sa-learned-content"


# ------------------------------------------------------------------------------ size


def test_the_page_size_is_the_maps_plus_a_small_page(pages, explorers):
    """Maps: layers x heads x T x T bytes and T float32 maxima per row, base64; one set or one per image."""
    T, layers, heads = 49, 2, 4
    per_set = layers * heads * T * (T + 4) * 4 / 3
    sizes = {model: path.stat().st_size for model, path in pages.items()}
    rest = sizes["sa-quadratic"] - per_set  # the page, its script and style, 6 images, heads.jsonl
    assert 0 < rest < 120_000
    assert sizes["sa-learned-content"] - sizes["sa-quadratic"] == pytest.approx(5 * per_set, rel=0.02)


def test_maps_over_the_limit_are_refused_before_anything_is_written(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export_module, "EXPORT_LIMIT", 100_000)
    out = tmp_path / "big.html"
    assert main(["explore", str(runs["sa-learned-content"]), "--images", "6", "--export", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--images 6" in err and "give fewer --images" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    # one map set whatever the images: a position-only model fits
    assert main(["explore", str(runs["sa-quadratic"]), "--images", "6", "--export", str(out)]) == 0


# ------------------------------------------------------------------------------ writing it


def test_the_cli_writes_the_page_and_refuses_to_clobber_a_file_it_did_not_write(runs, tmp_path, capsys):
    run = str(runs["sa-quadratic"])
    notes = tmp_path / "notes.html"
    notes.write_text("<p>my notes</p>")
    assert main(["explore", run, "--images", "3", "--export", str(notes)]) == 2
    err = capsys.readouterr().err
    assert "attnconv did not write it" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert notes.read_text() == "<p>my notes</p>"
    with pytest.raises(AttnconvError, match="attnconv did not write it"):
        write_export(run, notes, images=3)
    assert main(["explore", run, "--images", "3", "--export", str(notes), "--overwrite"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(str(notes)) and out.endswith("KiB)")
    assert _embedded(notes)["info"]["images"] == 3
    # its own page is replaced without --overwrite, and no temporary is left
    assert main(["explore", run, "--images", "2", "--export", str(notes)]) == 0
    assert _embedded(notes)["info"]["images"] == 2 and [p.name for p in tmp_path.iterdir()] == ["notes.html"]


@pytest.mark.parametrize("args, message", [
    (["--export", "{tmp}/page.png"], "give a file name ending in .html, .htm"),
    (["--export", "{tmp}/folder.html"], "is a directory"),
    (["--overwrite"], "--overwrite applies to --export FILE.html only"),
    (["--export", "{tmp}/page.html", "--images", "0"], "--images 0 is out of range"),
])
def test_bad_export_arguments_are_one_line(runs, tmp_path, capsys, args, message):
    (tmp_path / "folder.html").mkdir()
    argv = ["explore", str(runs["sa-quadratic"]), "--no-browser", *(a.format(tmp=tmp_path) for a in args)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["folder.html"] and not any((tmp_path / "folder.html").iterdir())


def test_cnn_and_converted_runs_are_refused_with_one_line(runs, tmp_path, capsys):
    from attnconv.runs import convert_run

    assert main(["explore", str(runs["resnet18"]), "--export", str(tmp_path / "a.html")]) == 2
    assert "no attention layers" in capsys.readouterr().err
    converted = convert_run(runs["resnet18"], tmp_path / "converted")
    assert main(["explore", str(converted), "--images", "2", "--export", str(tmp_path / "b.html")]) == 2
    err = capsys.readouterr().err
    assert "grids of their own, which --export does not write" in err and "attnconv explore RUN" in err \
        and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted"]


# ------------------------------------------------------------------------------ in a browser, from disk


def _open_offline(page, path) -> list[str]:
    """Open the file `path` in `page`, every request routed: the file itself goes through, anything else is
    aborted. Returns the list every request's URL goes to."""
    url = path.resolve().as_uri()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.route("**/*", lambda route: route.continue_() if route.request.url == url else route.abort())
    page.goto(url)
    return requests


def _maps(page, layers: int = 2, heads: int = 4) -> list:
    return [[json.loads(page.get_attribute(f"#map-{l}-{h}", "data-values")) for h in range(heads)]
            for l in range(layers)]


def test_the_exported_content_page_works_from_disk_with_no_request_leaving_it(pages, explorers):
    explorer = explorers["sa-learned-content"]
    with chromium_page("about:blank") as (page, errors):
        requests = _open_offline(page, pages["sa-learned-content"])
        page.wait_for_selector('#maps[data-status="ready"][data-image="0"][data-query="3,3"]')
        page.wait_for_selector('#centers[data-status="ready"][data-epoch="1"]')
        assert "sa-learned-content" in page.title()
        before = _maps(page)

        image, (i, j) = 4, (5, 2)
        page.click(f"#thumb-{image}")
        box = page.locator("#image").bounding_box()
        page.click("#image", position={"x": (j + 0.5) * box["width"] / 7, "y": (i + 0.5) * box["height"] / 7})
        page.wait_for_selector(f'#maps[data-status="ready"][data-image="{image}"][data-query="{i},{j}"]')
        after = _maps(page)
        assert after != before  # clicking a pixel changes the maps
        live = explorer.attention(image, i, j)["layers"]
        _close_to(np.array(after), np.array(live))
        for layer in range(2):
            for head in range(4):
                caption = page.text_content(f"#map-{layer}-{head} figcaption")
                k = int(np.argmax(live[layer][head]))
                assert caption.endswith(f"at ({k // 7}, {k % 7})"), caption

        page.focus("#image")  # the arrow keys move the query
        page.keyboard.press("ArrowUp")
        page.wait_for_selector(f'#maps[data-status="ready"][data-query="{i - 1},{j}"]')
        _close_to(np.array(_maps(page)), np.array(explorer.attention(image, i - 1, j)["layers"]))
        assert page.is_disabled('input[name="mode"][value="scores"]')
        assert page.is_disabled('input[name="term"][value="content"]')
        assert "Exported by attnconv explore --export" in page.text_content("#term-note")

        page.focus("#epoch")  # heads over training
        page.keyboard.press("ArrowLeft")
        page.wait_for_selector('#centers[data-status="ready"][data-epoch="0"]')
        shown = page.evaluate("window.__lastHeads")
        assert [[h["center"] for h in layer] for layer in shown["layers"]] == \
            [[h["center"] for h in layer] for layer in explorer.heads()["snapshots"][0]["layers"]]
        image0 = explorer.image(image)
        assert f"test image #{image0['test_index']}: label {image0['label_name']}" in page.text_content("#prediction")
        assert errors == []
        assert requests == [pages["sa-learned-content"].resolve().as_uri()]

        # the page's policy refuses any request it might try: nothing reaches the network
        page.evaluate("fetch('https://example.com/x').catch(() => null)")
        page.wait_for_timeout(200)
        assert requests == [pages["sa-learned-content"].resolve().as_uri()]


def test_the_exported_position_only_page_shows_one_map_set_for_every_image(pages, explorers):
    explorer = explorers["sa-quadratic"]
    with chromium_page("about:blank") as (page, errors):
        requests = _open_offline(page, pages["sa-quadratic"])
        page.wait_for_selector('#maps[data-status="ready"][data-image="0"][data-query="3,3"]')
        first = _maps(page)
        page.click("#thumb-5")
        page.wait_for_selector('#maps[data-status="ready"][data-image="5"][data-query="3,3"]')
        assert _maps(page) == first  # position-only: the same maps for every image
        box = page.locator("#image").bounding_box()
        page.click("#image", position={"x": 0.5 * box["width"] / 7, "y": 6.5 * box["height"] / 7})
        page.wait_for_selector('#maps[data-status="ready"][data-query="6,0"]')
        shown = _maps(page)
        assert shown != first
        _close_to(np.array(shown), np.array(explorer.attention(5, 6, 0)["layers"]))
        assert "positions alone" in page.text_content("#term-note")
        for width in WIDTHS:  # the live page's layout: no sideways scrolling
            overflow, wide = sideways_overflow(page, width)
            assert overflow <= 0 and wide == [], (width, overflow, wide)
        assert errors == [] and requests == [pages["sa-quadratic"].resolve().as_uri()]
