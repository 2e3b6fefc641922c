"""Fault rules on the nsqd TCP door (L{mqserver.faults}): what a rule does to a command.

C{respond} sends an nsqd error frame (C{E_PUB_FAILED}, ...) in the command's turn and
keeps the connection; C{delay} holds the command's answer, and every answer after it,
for the rule's seconds; C{drop} runs nothing and answers nothing; C{close} closes the
connection without running the command; C{split} and C{corrupt} run it and change the
bytes of its answer (L{mqserver.wiretap.tamper_output}).
"""

from twisted.internet import task

from mqserver.wiretap import tamper_output

from protocols.nsq.errors import NsqError

#: The door's name (its key under C{listen:}).
DOOR = "nsqd_tcp"
#: The nsqd HTTP door's name (its rules: L{mqserver.webfaults}).
HTTP_DOOR = "nsqd_http"
#: The embedded nsqlookupd's HTTP door's name (its rules: L{mqserver.webfaults}).
LOOKUPD_HTTP_DOOR = "lookupd_http"
#: The actions this door applies.
ACTIONS = ("respond", "delay", "drop", "close", "split", "corrupt")


def check_fault(rule):
    """Raise ValueError when the nsqd TCP door cannot apply fault rule C{rule}."""
    if rule.action not in ACTIONS:
        raise ValueError(f"door {DOOR} cannot {rule.action} (it can: {', '.join(ACTIONS)})")
    code = rule.value
    if rule.action == "respond" and not (
            code.startswith("E_") and code[2:].replace("_", "").isalnum() and code.isupper()):
        raise ValueError(f"respond wants an nsqd error code such as E_PUB_FAILED, not {code!r}")


def fault_error(rule, verb):
    """Return the error (non-fatal) a C{respond} rule answers command C{verb} with."""
    desc = rule.remark or f"{verb} failed: injected by mqserver fault rule {rule.id}"
    return NsqError(rule.value, desc, fatal=False)


def apply_fault(conn, rule, cmd):
    """Apply C{rule} to C{cmd}, a command connection C{conn} (an L{NsqdProtocol}) read."""
    action = rule.action
    if action == "respond":
        conn._fail(fault_error(rule, cmd.verb))
    elif action == "close":
        conn._dead_input = True  # nothing after it in this read runs either
        conn.can_receive = False
        conn.transport.loseConnection()
    elif action == "delay":
        # an empty answer that comes after the delay: the command's own answer, and every
        # one after it, wait behind it (answers go out in command order)
        conn._answer(task.deferLater(conn.reactor, rule.value, bytes))
        conn._run(cmd)
    elif action in ("split", "corrupt"):
        conn._flush()  # deliveries buffered before it go out as they are
        conn.output.detach()
        tamper_output(conn, rule, conn.reactor)
        conn._run(cmd)
    # drop: nothing runs, nothing is answered
