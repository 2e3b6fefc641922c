"""Where a follower's log and its master's part: master terms (epochs) compared.

Each master that followers confirm to starts a term by writing an epoch record (the
term's number; its eventId is the term's first). Two logs agree on a term when both hold
its epoch record at the same eventId, and a term of the master's log ends where the
master's next term begins. A follower whose log goes on past the end of the last term it
shares with the master holds records that the master (and so any majority that
confirmed the master's writes) does not: records that were never acknowledged. They are
cut before it follows, so that no eventId ever names two different records in a group.
"""


class EpochError(Exception):
    """The follower cannot follow this master; the text says why."""


def truncation_point(ours, our_last, theirs, their_last):
    """Return the eventId after which our log must be cut to follow a master, or None
    when our log is a prefix of the master's (nothing to cut).

    @param ours: our master terms, [(epoch, first eventId)], oldest first.
    @param our_last: our last eventId.
    @param theirs: the master's terms, likewise.
    @param their_last: the master's last eventId.
    @raise EpochError: the master is of an older term than ours (it was replaced and does
        not know it yet), or our logs share no term.
    """
    if not ours:
        return None  # a log that never saw a term (it only followed): nothing to compare
    if not theirs or theirs[-1][0] < ours[-1][0]:
        raise EpochError(
            f"the master is in term {theirs[-1][0] if theirs else 0}, before ours"
            f" ({ours[-1][0]}): it was replaced; not following it")
    starts = {epoch: first for epoch, first in theirs}
    for epoch, first in reversed(ours):
        if starts.get(epoch) == first:
            break
    else:
        raise EpochError(
            "our log and the master's share no term: start this follower from an empty"
            " data directory")
    later = [f for e, f in theirs if e > epoch]
    end = later[0] - 1 if later else their_last
    return end if end < our_last else None
