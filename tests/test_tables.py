import pytest

from attnconv.tables import format_table, significant


def test_text_table_pads_columns_to_the_widest_cell():
    lines = format_table(["name", "n"], [["a", "10"], ["long name", "2"]]).splitlines()
    assert lines == ["name       n", "---------  --", "a          10", "long name  2"]


def test_right_aligned_text_columns_pad_on_the_left():
    lines = format_table(["name", "n"], [["a", "10"], ["b", "2"]], align="lr").splitlines()
    assert lines[2:] == ["a     10", "b      2"]


def test_markdown_rule_marks_the_alignment():
    text = format_table(["model", "acc", "params"], [["resnet18", "0.938", "11.2M"]], markdown=True, align="lrr")
    assert text == "| model | acc | params |\n|---|---:|---:|\n| resnet18 | 0.938 | 11.2M |"
    assert format_table(["a"], [], markdown=True) == "| a |\n|---|"


def test_a_row_of_the_wrong_width_or_a_bad_alignment_is_refused():
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        format_table(["a", "b", "c"], [["1", "2"]])
    with pytest.raises(ValueError, match="align"):
        format_table(["a", "b"], [], align="lc")


@pytest.mark.parametrize("value, text", [
    (0.903312, "0.903"), (0.1, "0.100"), (1.0, "1.00"), (12.345, "12.3"), (999.7, "1000"), (1234.5, "1230"),
    (0.99951, "1.00"), (-0.031249, "-0.0312"), (0.000123456, "0.000123"), (1.234e-5, "1.23e-5"),
    (2.5e7, "2.50e+7"), (0, "0"), (0.0, "0"), (None, "-"), (float("nan"), "-"), (float("inf"), "inf"), (7, "7.00"),
])
def test_numbers_people_read_have_3_significant_digits(value, text):
    assert significant(value) == text
