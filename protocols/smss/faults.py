"""Fault rules on the smss door (L{mqserver.faults}): what a rule does to a request.

A request's command goes by its name (C{PUB}, C{SUB}, C{CREATE}, C{TOPIC_INFO}, ...) or
its code (C{1}, C{0}, ...). C{respond} answers an ERR (400) with the rule's text in the
request's turn; C{delay} holds the request's answer, and every answer after it (a SUB
starts after it), for the rule's seconds; C{drop} runs nothing and answers nothing;
C{close} closes the connection without running the request; C{split} and C{corrupt} run
it and change the bytes of its answer (L{mqserver.wiretap.tamper_output}).
"""

from twisted.internet import task

from mqserver.wiretap import tamper_output

from protocols.smss import codec, messages as m, wire

#: The door's name (its key under C{listen:}).
DOOR = "smss"
#: The actions this door applies.
ACTIONS = ("respond", "delay", "drop", "close", "split", "corrupt")

#: Request event type -> the names a rule's command may give it.
NAMES = {
    m.Pub: ("PUB", str(wire.CMD_PUB)), m.Delay: ("DELAY", str(wire.CMD_DELAY)),
    m.Create: ("CREATE", str(wire.CMD_CREATE)), m.Delete: ("DELETE", str(wire.CMD_DELETE)),
    m.Alive: ("ALIVE", str(wire.CMD_ALIVE)), m.TopicInfo: ("TOPIC_INFO", str(wire.CMD_TOPIC_INFO)),
    m.List: ("LIST", str(wire.CMD_LIST)), m.ValidList: ("VALID_LIST", str(wire.CMD_VALID_LIST)),
    m.Sub: ("SUB", str(wire.CMD_SUB)), m.Replica: ("REPLICA", str(wire.CMD_REPLICA)),
}


def check_fault(rule):
    """Raise ValueError when the smss door cannot apply fault rule C{rule}."""
    if rule.action not in ACTIONS:
        raise ValueError(f"door {DOOR} cannot {rule.action} (it can: {', '.join(ACTIONS)})")


def apply_fault(conn, ev):
    """Apply the fault rule (if any) for request C{ev} of connection C{conn} (an
    L{SmssServerProtocol}); return True when the rule took the request (answered,
    dropped or closed), False when the connection is to handle it (no rule, or a
    delay, whose answer then waits)."""
    rule = conn.tap.fault(DOOR, conn, NAMES.get(type(ev), (type(ev).__name__.upper(),)))
    if rule is None:
        return False
    action = rule.action
    if action == "respond":
        conn._answer(codec.err(rule.value))
    elif action == "close":
        conn.transport.loseConnection()
    elif action == "delay":
        # an empty answer that comes after the delay: the request's own answer, and every
        # one after it, wait behind it (answers go out in request order)
        conn._answer(task.deferLater(conn.factory.reactor, rule.value, bytes))
        conn.looked = ev  # when a held SUB comes back, it is not matched again
        return False
    elif action in ("split", "corrupt"):
        conn.output.detach()
        tamper_output(conn, rule, conn.factory.reactor)
        conn.looked = ev
        return False
    return True
