"""Groups of runs side by side (attnconv.analysis.compare, `attnconv compare`) from metrics.csv and heads.jsonl."""

import json
import re

import numpy as np
import pytest

from attnconv.analysis.compare import (
    center_displacement,
    compare_groups,
    displacement_history,
    format_comparison,
    group_runs,
)
from attnconv.cli import main
from attnconv.errors import AttnconvError
from attnconv.runs import heads_line, metrics_text


def _metrics(accs):
    return metrics_text([{"epoch": e + 1, "step": 10 * (e + 1), "train_loss": 1.0, "train_acc": 0.5, "test_loss": 1.0,
                          "test_acc": a, "seconds": 1.0, "images_per_s": 1.0, "lr": 0.1} for e, a in enumerate(accs)])


def _snap(epoch, layers):
    return {"epoch": epoch, "step": 10 * epoch,
            "layers": [[{"center": list(map(float, c)), "attention_distance": float(d), "alpha": 0.5}
                        for c, d in zip(centers, dists)] for centers, dists in layers]}


def write_run(path, accs, snapshots):
    path.mkdir(parents=True)
    (path / "metrics.csv").write_text(_metrics(accs))
    if snapshots is not None:
        (path / "heads.jsonl").write_text("".join(heads_line(s) for s in snapshots))
    return path


def test_displacement_grid_and_accuracy_over_seeds(tmp_path):
    rng = np.random.default_rng(0)
    grid = np.array([(r, c) for r in (-1, 0, 1) for c in (-1, 0, 1)], dtype=float)
    groups = tmp_path / "recipe"
    moved1 = []
    for seed, acc in ((0, 0.8), (1, 0.9)):
        start = rng.normal(0, 2, size=(2, 9, 2))  # each seed's own initialization, as real seeds have
        # layer 1 moves to near the 3x3 grid; layer 2 moves by 0.25 tokens along rows only
        end1 = grid + rng.uniform(-0.1, 0.1, size=(9, 2))
        moved1.append(np.linalg.norm(end1 - start[0], axis=1))
        end2 = start[1] + np.array([0.25, 0.0])
        write_run(groups / f"seed{seed}", [0.5, acc], [
            _snap(0, [(start[0], [3.0] * 9), (start[1], [2.0] * 9)]),
            _snap(1, [(start[0], [3.0] * 9), (start[1], [2.0] * 9)]),
            _snap(2, [(end1, [1.0] * 9), (end2, [4.0] * 9)]),
        ])
    (row,) = compare_groups([groups], kernels=(3, 4))
    assert row["seeds"] == 2 and row["epoch"] == 2
    assert row["test_acc"] == pytest.approx(0.85) and row["test_acc_std"] == pytest.approx(np.std([0.8, 0.9], ddof=1))
    l1, l2 = row["layers"]
    assert l1["grid3_within"] == 9 and l1["grid3_matched"] < 0.15 and l1["attention_distance"] == 1.0
    assert l2["moved_mean"] == pytest.approx(0.25) and l2["moved_max"] == pytest.approx(0.25)
    assert l1["moved_mean"] == pytest.approx(np.mean([m.mean() for m in moved1]))
    assert l1["moved_max"] == pytest.approx(max(m.max() for m in moved1))
    # after epoch 1 nothing has moved yet; the accuracy is that epoch's
    (early,) = compare_groups([groups], epoch=1)
    assert early["test_acc"] == pytest.approx(0.5) and all(layer["moved_max"] == 0 for layer in early["layers"])
    (init,) = compare_groups([groups], epoch=0)  # initialization: heads, no accuracy yet
    assert init["test_acc"] is None and all(layer["moved_max"] == 0 for layer in init["layers"])
    assert "| - |" in format_comparison([init], markdown=True)
    history = displacement_history(groups)
    assert history["epochs"] == [0, 1, 2] and history["moved_mean"][1] == [0.0, 0.0]
    assert history["moved_mean"][2][1] == pytest.approx(0.25) and history["moved_max"][2][0] == l1["moved_max"]
    text = format_comparison([row], kernels=(3, 4))
    assert "9.0/9" in text and "0.8500 ± 0.0707" in text


def test_center_displacement_is_per_head_euclidean():
    a = _snap(0, [([(0, 0), (1, 1)], [1, 1])])
    b = _snap(3, [([(3, 4), (1, 1)], [1, 1])])
    (d,) = center_displacement(a, b)
    assert d.tolist() == [5.0, 0.0]
    with pytest.raises(AttnconvError, match="heads"):
        center_displacement(a, _snap(3, [([(3, 4)], [1])]))


def test_a_cnn_group_gives_accuracy_only_and_a_single_run_is_a_group(tmp_path):
    cnn = write_run(tmp_path / "cnn" / "seed0", [0.93], None)
    rows = compare_groups([tmp_path / "cnn"]) + compare_groups([cnn])  # together: one run twice, refused
    assert [r["seeds"] for r in rows] == [1, 1] and rows[0]["layers"] == []
    assert group_runs(cnn) == [cnn]


def test_bad_groups_are_one_clear_error(tmp_path):
    with pytest.raises(AttnconvError, match="no such folder"):
        compare_groups([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(AttnconvError, match="holds no run"):
        compare_groups([tmp_path / "empty"])
    run = write_run(tmp_path / "g" / "seed0", [0.5], [_snap(1, [([(0, 0)], [1])])])
    with pytest.raises(AttnconvError, match="initialization"):
        compare_groups([run])
    with pytest.raises(AttnconvError, match="epoch 7"):
        compare_groups([run], epoch=7)


def test_cli_prints_the_table_and_json_and_refuses_bad_kernels(tmp_path, capsys):
    write_run(tmp_path / "r" / "seed0", [0.5, 0.6], [_snap(0, [([(0, 0)], [1])]), _snap(2, [([(1, 0)], [2])])])
    assert main(["compare", str(tmp_path / "r"), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| group |") and "| 1.00 |" in out
    assert main(["compare", str(tmp_path / "r"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["layers"][0]["moved_mean"] == 1.0
    assert main(["compare", str(tmp_path / "r"), "--kernels", "3,3"]) == 0  # round 77: its columns were printed twice
    assert capsys.readouterr().out.splitlines()[0].count("3x3 within") == 1
    assert main(["compare", str(tmp_path / "r"), "--kernels", "3,x"]) == 2
    assert "--kernels" in capsys.readouterr().err
    for bad in ("0", "3,16", ","):  # said in the flag's own words, not as the library's tuple
        assert main(["compare", str(tmp_path / "r"), "--kernels", bad]) == 2
        err = capsys.readouterr().err
        assert f"--kernels '{bad}': give comma-separated kernel sizes from 1 to 15" in err and "(" not in err, err
    # one table or the other, not one silently over the other
    assert main(["compare", str(tmp_path / "r"), "--json", "--markdown"]) == 2
    assert "--markdown: not allowed with argument --json" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "nope")]) == 2


@pytest.mark.parametrize("loop", [False, True])
@pytest.mark.parametrize("name", ["metrics.csv", "config.json", "heads.jsonl"])
def test_a_run_file_that_is_a_link_to_nothing_is_named_not_taken_for_a_file_not_written(tmp_path, capsys, name,
                                                                                          loop):
    """A metrics.csv, heads.jsonl or config.json that is a link whose file is gone read as no file at all: a run
    "with no finished epoch yet", a run without heads, a copy of the logs alone. Each is one error naming the
    link and where it points; a link to itself (a loop) is named as one, not as "a broken link"."""
    run = write_run(tmp_path / "g" / "seed0", [0.9], [_snap(0, [([[0, 0]], [1.0])]), _snap(1, [([[1, 0]], [1.0])])])
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(name if loop else tmp_path / "elsewhere" / name)
    assert main(["compare", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / name}: ") and err.count("\n") == 1, err
    why = "which loops back through links" if loop else "which does not exist"
    assert f"a link to {name if loop else tmp_path / 'elsewhere' / name}, {why}" in err, err


def test_a_run_folder_that_is_a_link_loop_is_named_by_every_reader(tmp_path, capsys):
    """A run folder that is a link to itself was "no such directory" / "no such folder" / "no such run directory";
    `train --out LOOP --resume` asked for --model and --dataset, and with them said "cannot write there (File
    exists)": each names the link and the loop."""
    (tmp_path / "loop").symlink_to("loop")
    loop = tmp_path / "loop"
    for command in (["eval", loop], ["table", loop], ["compare", loop], ["report", loop], ["plot", "centers", loop],
                    ["train", "--out", loop, "--resume"],
                    ["train", "--model", "sa-quadratic", "--dataset", "fashion-mnist", "--out", loop]):
        assert main([str(c) for c in command]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a link to loop, which loops back through links" in err, (command, err)


def test_links_to_nowhere_as_data_folders_and_outputs_are_named(tmp_path, capsys):
    """A link loop as `--dataset folder:LOOP`, `--data-dir LOOP` or `convert --out LOOP` said "does not exist", "no
    such directory" or "could not write the converted run (Not a directory)"."""
    (tmp_path / "loop").symlink_to("loop")
    loop = str(tmp_path / "loop")
    for command in (["train", "--model", "sa-quadratic", "--dataset", f"folder:{loop}", "--out", str(tmp_path / "r")],
                    ["train", "--model", "sa-quadratic", "--dataset", "fashion-mnist", "--data-dir", loop, "--out",
                     str(tmp_path / "r")]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a link to loop, which loops back through links" in err, (command, err)


def test_a_run_in_two_of_the_groups_compared_is_refused(tmp_path, capsys):
    """A run given twice, or a run and its group, showed the same run in two columns as if they were two."""
    def snaps(seed):
        return [_snap(0, [([(seed, 0.0)] * 2, [1.0] * 2)]), _snap(1, [([(seed + 1.0, 0.0)] * 2, [1.0] * 2)])]

    group = tmp_path / "group"
    for seed in (0, 1):
        write_run(group / f"seed{seed}", [0.5 + seed / 10], snaps(seed))
    other = write_run(tmp_path / "other", [0.7], snaps(2))
    assert len(compare_groups([group, other])) == 2
    for groups, said in (([other, str(other) + "/"], f"{other}/ is given twice"),
                         ([group, group / "seed1"], f"{group} and {group / 'seed1'} hold the same run ({group / 'seed1'})")):
        with pytest.raises(AttnconvError, match="^" + re.escape(said) + ": give each group once$"):
            compare_groups(groups)
    assert main(["compare", str(other), str(other)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {other} is given twice: give each group once"


def test_round_65_a_compare_groups_refuses_arguments_of_other_kinds_in_one_line(tmp_path):
    """Round 65: a group given as one string was read letter by letter (`g: not a group`), one Path and kernels=3
    were TypeError tracebacks, kernels=(True,) was taken as 1."""
    write_run(tmp_path / "grp", [0.5], [_snap(0, [([(0.0, 0.0)], [1.0])]), _snap(1, [([(1.0, 0.0)], [1.0])])])
    for groups, kwargs, said in (("grp", {}, "groups 'grp' is not a list of groups"),
                                 (tmp_path / "grp", {}, "is not a list of groups"),
                                 ([tmp_path / "grp", 3], {}, "groups holds 3: give each group as a folder's path"),
                                 ([tmp_path / "grp"], {"kernels": 3}, "kernels 3 is invalid: give kernel sizes from 1"),
                                 ([tmp_path / "grp"], {"kernels": (True,)}, "kernels (True,) is invalid")):
        with pytest.raises(AttnconvError, match=re.escape(said)):
            compare_groups(groups, **kwargs)
    assert len(compare_groups((tmp_path / "grp",), kernels=[3])) == 1
