"""app/terminal: the one writer; every control character of data shown as its escape, twice's
own colours only where asked, tables of text that is never markup."""

import io

from twice.app.terminal import printable, style, table_text, write_line


def test_control_characters_of_data_are_shown_escaped_and_lines_and_tabs_kept():
    hostile = "name\x1b[2J\rnext\u202eevil\nline\ttab"
    assert printable(hostile) == "name\\x1b[2J\\x0dnext\\u202eevil\nline\ttab"
    painted = style("ok", True, fg="green")
    assert printable(painted, color=True) == "\x1b[32mok\x1b[0m"
    assert printable(painted) == "ok"  # no colour asked: twice's own sequences dropped
    assert style("plain", False, fg="red") == "plain"
    assert printable("\x1b[32mforged\x1b[0m", color=True) == "\\x1b[32mforged\\x1b[0m"


def test_a_line_is_written_escaped_and_flushed():
    stream = io.StringIO()
    write_line(stream, "step 3\x07 done")
    assert stream.getvalue() == "step 3\\x07 done\n"


def test_a_table_holds_text_never_markup_and_cuts_the_last_column_to_the_width():
    columns = {"run": {}, "status": {}, "command": {"rest": True}}
    rows = [["[bold]a[/bold]", "completed", "python train.py"], ["b\x1b[5m", "failed", "sh"]]
    text = table_text(columns, rows, notes=["1 note\x1b[8m"], width=80)
    lines = text.splitlines()
    assert lines[0].split() == ["run", "status", "command"]
    assert lines[2].split() == ["[bold]a[/bold]", "completed", "python", "train.py"]
    assert lines[3].split() == ["b\\x1b[5m", "failed", "sh"] and "\x1b" not in text
    assert lines[-1] == "1 note\\x1b[8m"
    long = table_text(columns, [["a", "completed", "python " + "x" * 200]], width=60)
    assert all(len(line) <= 60 for line in long.splitlines()) and long.splitlines()[2][-1] == "…"
    assert table_text(columns, [], notes=["nothing yet"]) == "nothing yet"


def test_a_tables_long_column_gives_way_and_every_other_cell_shows_whole():
    """Generated tables: the `rest` column is cut to the width the others leave; no other cell
    is cut and no line is wider than the width."""
    import random

    draw = random.Random(7)
    for _ in range(60):
        widths = [draw.randint(1, 12) for _ in range(draw.randint(1, 4))]
        rest = draw.randrange(len(widths) + 1)
        columns = {f"c{i}": {} for i in range(len(widths) + 1)}
        columns[f"c{rest}"] = {"rest": True}
        rows = [
            [
                "y" * draw.randint(20, 300)
                if i == rest
                else "x" * draw.randint(1, widths[i - (i > rest)])
                for i in range(len(widths) + 1)
            ]
            for _ in range(draw.randint(1, 4))
        ]
        width = sum(max(2, w) + 2 for w in widths) + draw.randint(14, 40)  # room for 10 and gaps
        lines = table_text(columns, rows, width=width).splitlines()
        assert max(len(line) for line in lines) <= width
        body = "\n".join(lines)
        for row in rows:
            for i, cell in enumerate(row):
                assert i == rest or cell in body
