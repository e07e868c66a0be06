"""The server's phase (supervisor/phase.py): one value, changed only along its table, as a
child's state is. Plain values, no processes."""

import pytest

from numaserve.supervisor.phase import (
    NEXT,
    Created,
    Ended,
    PhaseError,
    Reloading,
    Serving,
    Starting,
    Stopping,
    check_next,
    expect,
)
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.stop import Stop


def test_a_phase_may_follow_only_those_its_table_allows():
    assert check_next(Created(), Starting()) == Starting()
    assert check_next(Starting(), Serving()) == Serving()
    assert check_next(Stopping(Stop(0)), Ended(0)) == Ended(0)
    with pytest.raises(PhaseError, match="from Serving to Created"):
        check_next(Serving(), Created())
    with pytest.raises(PhaseError, match="from Stopping to Serving"):
        check_next(Stopping(Stop(0)), Serving())  # a stop is never undone
    with pytest.raises(PhaseError, match="from Ended to Starting"):
        check_next(Ended(0), Starting())


def test_a_phase_may_follow_itself_with_what_it_holds_changed():
    assert check_next(Starting(), Starting()) == Starting()  # the start's processes all begun
    assert check_next(Ended(0), Ended(0)) == Ended(0)


def test_every_phase_but_the_end_leads_on_and_every_one_can_be_reached():
    reached = {after for nexts in NEXT.values() for after in nexts}
    assert set(NEXT) - reached == {Created}
    assert [phase for phase, nexts in NEXT.items() if not nexts] == [Ended]
    # a stop can begin from every phase that runs something
    assert all(Stopping in NEXT[p] for p in NEXT if p not in (Created, Stopping, Ended))


def test_each_phase_says_the_mood_status_and_metrics_show():
    assert Starting.mood is Mood.STARTING and Serving.mood is Mood.SERVING
    assert Reloading.mood is Mood.RELOADING and Stopping.mood is Mood.STOPPING


def test_what_only_one_phase_holds_is_read_through_it_or_the_arbiter_stops_on_the_bug():
    reload = Reloading(wanted=None, final_table=3)  # type: ignore[arg-type]
    assert expect(reload, Reloading) is reload
    with pytest.raises(PhaseError, match="the server is Serving, not Reloading"):
        expect(Serving(), Reloading)
