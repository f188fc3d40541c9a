"""What the history checker's report says about a duplicated write."""

from __future__ import annotations

from infra.checks.checker import Op, Report, _doubled


def test_a_duplicated_write_is_said_whole_its_answer_its_send_time_and_both_positions():
    op = Op(50, user=7, began=1796427600.25, took=5.01, status=503)
    line = _doubled(50, op, {(2, 411), (0, 97)})
    assert line == "write 50, answered 503 after 5.01s, sent at 1796427600.250 (token -), at 0@97, 2@411"
    assert _doubled(9, None, {(1, 3), (1, 4)}) == "write 9, never sent, at 1@3, 1@4"
    assert "no answer" in _doubled(3, Op(3, 1, 0.0, 15.0, 0), {(0, 1), (0, 2)})
    report = Report(attempted=2, acknowledged=1, lost=[], duplicated=[50], phantom=[],
                    indeterminate=[50], not_in_views=[], refusals=[], doubled=[line])
    assert not report.ok
    assert report.render().endswith(f"\n  duplicated: {line}")
