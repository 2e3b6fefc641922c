"""Fault rules: what a front door does to a request instead of (or besides) its usual
answer, so a client library can be tested against a server that misbehaves on purpose.

A rule matches a front door (by its name under C{listen:}), and optionally a command
(the name or number the door gives it: a RocketMQ request code, an NSQ verb, an HTTP
route; several separated by C{|}), a connection id, a client address, and every Nth
match. Its action is one of L{ACTIONS}; each door says which it supports and renders
C{respond} in its protocol's own form. A rule ends after C{times} uses or C{seconds}
seconds.

The registry knows no wire format. Doors register themselves (L{FaultRules.door}) with
the check of their rules' values, so a rule for a door that is not listening, or with a
value the door cannot send, is refused when it is added.
"""

import itertools

from twisted.logger import Logger

#: What a rule can do: answer with an error instead of serving the request; serve it
#: but hold its answer back; serve it without answering; close the connection instead
#: of serving it; serve it and write its answer a few bytes at a time; serve it and
#: change one byte of its answer.
ACTIONS = ("respond", "delay", "drop", "close", "split", "corrupt")

#: The most rules the registry holds at once.
MAX_RULES = 1000

#: The actions an HTTP door applies (L{mqserver.webfaults}).
HTTP_ACTIONS = ("respond", "delay", "drop", "close", "split", "corrupt")


def check_http(rule):
    """Raise ValueError when an HTTP door cannot apply fault rule C{rule}: its C{respond}
    is an HTTP error status."""
    if rule.action not in HTTP_ACTIONS:
        raise ValueError(f"door {rule.door} cannot {rule.action} "
                         f"(it can: {', '.join(HTTP_ACTIONS)})")
    if rule.action == "respond" and not (rule.value.isdigit() and 400 <= int(rule.value) <= 599):
        raise ValueError(f"respond wants an HTTP error status (400..599), not {rule.value!r}")


class FaultRule:
    """One rule (see the module docstring).

    @ivar id: its number, unique in the broker's run.
    @ivar action: one of L{ACTIONS}; C{value} is the action's argument: the error to
        respond with (text, as the door names it), the delay in seconds, the size of
        the pieces of a split answer in bytes, the offset of the byte to corrupt
        (negative: from the end); None for drop and close.
    @ivar remark: the error's text, for doors whose errors carry one (or None).
    @ivar every: the rule applies to every C{every}th request it matches.
    @ivar times: uses left before it ends, or None.
    @ivar expires_at: when it ends (the clock's seconds), or None.
    @ivar matched: requests it matched; C{applied}: times it acted.
    """

    def __init__(self, rule_id, door, action, value=None, command=None, conn=None,
                 address=None, every=1, times=None, expires_at=None, remark=None):
        self.id = rule_id
        self.door = door
        self.action = action
        self.value = value
        self.command = command
        self.conn = conn
        self.address = address
        self.every = every
        self.times = times
        self.expires_at = expires_at
        self.remark = remark
        self.matched = 0
        self.applied = 0

    def selects(self, door, conn, host, port, names):
        """True when the rule is for this request (before L{every} counts)."""
        if door != self.door:
            return False
        if self.command is not None and not any(c in names for c in self.command.split("|")):
            return False
        if self.conn is not None and self.conn != conn:
            return False
        if self.address is not None and self.address not in (host, f"{host}:{port}"):
            return False
        return True

    def describe(self):
        """Return the rule in a few words, for the log."""
        what = self.action if self.value is None else f"{self.action} {self.value}"
        parts = [f"door {self.door}"]
        for name in ("command", "conn", "address"):
            v = getattr(self, name)
            if v is not None:
                parts.append(f"{name} {v}")
        if self.every > 1:
            parts.append(f"every {self.every}")
        return f"{what} on {', '.join(parts)}"

    def to_dict(self, now):
        """Return the rule as JSON-ready values."""
        return {"id": self.id, "door": self.door, "action": self.action, "value": self.value,
                "remark": self.remark, "command": self.command, "conn": self.conn,
                "address": self.address, "every": self.every, "times_left": self.times,
                "seconds_left": (None if self.expires_at is None
                                 else round(max(0.0, self.expires_at - now), 3)),
                "matched": self.matched, "applied": self.applied}


def _number(spec, key, kind, low, what):
    v = spec.get(key)
    if v is None:
        return None
    ok = (kind is int and isinstance(v, int) and not isinstance(v, bool)) or (
        kind is float and isinstance(v, (int, float)) and not isinstance(v, bool))
    if not ok or v < low:
        raise ValueError(f"{key} must be {what}")
    return kind(v)


def _text(spec, key):
    v = spec.get(key)
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)  # a RocketMQ request code given as a number
    if not isinstance(v, str) or not v:
        raise ValueError(f"{key} must be a non-empty string")
    return v


class FaultRules:
    """The broker's fault rules.

    @ivar active: True while any rule exists: the one attribute a front door reads on
        its usual path (through L{mqserver.wiretap.WireTap}).
    @ivar applied_total: {(door, action): times a rule acted}, since the start.
    @ivar on_change: called with no argument when L{active} may have changed.
    """

    log = Logger()

    def __init__(self, clock, on_change=None, call_later=None):
        """C{clock} gives the time in seconds; C{call_later} (a reactor's), if given,
        ends a rule when its seconds are up, else it ends at the next match or
        listing."""
        self._clock = clock
        self._call_later = call_later
        self._timers = {}  # rule -> the delayed call ending it
        self._rules = []
        self._ids = itertools.count(1)
        self._doors = {}  # door name -> check(rule) raising ValueError
        self.active = False
        self.applied_total = {}
        self.on_change = on_change

    # -- doors ---------------------------------------------------------------------------

    def door(self, name, check):
        """Make rules for front door C{name} possible; C{check(rule)} raises ValueError
        (its text for the operator) when the door cannot apply C{rule}."""
        self._doors[name] = check

    def doors(self):
        """Return the names of the doors rules can be set on."""
        return sorted(self._doors)

    # -- rules ---------------------------------------------------------------------------

    def add(self, spec):
        """Add a rule from C{spec} (a dict: C{door}, exactly one action key of
        L{ACTIONS} with its value, optional C{command}, C{conn}, C{address}, C{every},
        C{times}, C{seconds}, C{remark}); return it.

        @raise ValueError: what is wrong with C{spec}.
        """
        if not isinstance(spec, dict):
            raise ValueError("a rule is a JSON object")
        unknown = set(spec) - set(ACTIONS) - {"door", "command", "conn", "address", "every",
                                              "times", "seconds", "remark"}
        if unknown:
            raise ValueError(f"unknown rule field(s): {', '.join(sorted(unknown))}")
        door = spec.get("door")
        if door not in self._doors:
            doors = ", ".join(self.doors()) or "none"
            raise ValueError(f"no front door {door!r} takes fault rules (these do: {doors})")
        actions = [a for a in ACTIONS if a in spec and spec[a] is not False]
        if len(actions) != 1:
            raise ValueError(f"give exactly one action of {', '.join(ACTIONS)}")
        action = actions[0]
        raw = spec[action]
        if action == "respond":
            value = _text(spec, "respond")
        elif action == "delay":
            value = _number(spec, "delay", float, 0, "a number of seconds >= 0")
        elif action == "split":
            value = 1 if raw is True else _number(spec, "split", int, 1, "a number of bytes >= 1")
        elif action == "corrupt":
            value = 0 if raw is True else _number(spec, "corrupt", int, -(1 << 31),
                                                    "a byte offset (negative: from the end)")
        else:
            if raw is not True:
                raise ValueError(f"{action} takes true")
            value = None
        if len(self._rules) >= MAX_RULES:
            raise ValueError(f"{MAX_RULES} rules are set already: clear some first")
        seconds = _number(spec, "seconds", float, 0, "a number of seconds > 0")
        if seconds == 0:
            raise ValueError("seconds must be a number of seconds > 0")
        rule = FaultRule(
            None, door, action, value,
            command=_text(spec, "command"), conn=_number(spec, "conn", int, 0, "a connection id"),
            address=_text(spec, "address"),
            every=_number(spec, "every", int, 1, "an integer >= 1") or 1,
            times=_number(spec, "times", int, 1, "an integer >= 1"),
            expires_at=None if seconds is None else self._clock() + seconds,
            remark=_text(spec, "remark"))
        self._doors[door](rule)
        rule.id = next(self._ids)  # numbered once accepted
        self._rules.append(rule)
        if seconds is not None and self._call_later is not None:
            self._timers[rule] = self._call_later(seconds, self._time_up, rule)
        self.log.warn("fault rule {id} active: {rule}", id=rule.id, rule=rule.describe())
        self._changed()
        return rule

    def rules(self):
        """Return the rules in force, oldest first (expired ones are dropped first)."""
        self._expire()
        return list(self._rules)

    def list(self):
        """Return the rules in force as JSON-ready dicts."""
        now = self._clock()
        return [r.to_dict(now) for r in self.rules()]

    def clear(self, rule_id=None):
        """Remove rule C{rule_id}, or every rule; return how many were removed."""
        before = len(self._rules)
        kept = [r for r in self._rules if rule_id is not None and r.id != rule_id]
        for r in self._rules:
            if r not in kept:
                self._stop_timer(r)
        self._rules = kept
        removed = before - len(self._rules)
        if removed:
            self.log.info("fault rules cleared: {n}", n=removed)
            self._changed()
        return removed

    def match(self, door, conn, host, port, names):
        """Return the rule to apply to a request to C{door} on connection C{conn} from
        C{host}:C{port}, whose command goes by any of C{names}, or None. The first rule
        that selects it counts the match; an applied rule counts a use (and ends once it
        has no use left)."""
        now = self._clock()
        for rule in self._rules:
            if rule.expires_at is not None and now >= rule.expires_at:
                continue
            if not rule.selects(door, conn, host, port, names):
                continue
            rule.matched += 1
            if rule.matched % rule.every:
                continue  # not its turn: a later rule may still apply
            rule.applied += 1
            key = (door, rule.action)
            self.applied_total[key] = self.applied_total.get(key, 0) + 1
            if rule.times is not None:
                rule.times -= 1
                if rule.times == 0:
                    self._end(rule, "used up")
            self._expire()
            return rule
        self._expire()
        return None

    def _time_up(self, rule):
        self._timers.pop(rule, None)
        if rule in self._rules:
            self._end(rule, "expired")

    def _stop_timer(self, rule):
        timer = self._timers.pop(rule, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _end(self, rule, why):
        self._stop_timer(rule)
        self._rules.remove(rule)
        self.log.info("fault rule {id} ended ({why}): {rule}", id=rule.id, why=why,
                      rule=rule.describe())
        self._changed()

    def _expire(self):
        now = self._clock()
        for rule in [r for r in self._rules if r.expires_at is not None and now >= r.expires_at]:
            self._end(rule, "expired")

    def _changed(self):
        active = bool(self._rules)
        if active != self.active:
            self.active = active
            if not active:
                self.log.info("no fault rule is active")
        if self.on_change is not None:
            self.on_change()
