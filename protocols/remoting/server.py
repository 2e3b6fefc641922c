"""A remoting connection: frames in, handlers by request code, responses out.

Shared by the nameserver, the broker and the broker's registration client. Requests are
handled as they arrive; a handler returns a L{RemotingCommand} (or its encoded frame,
bytes), a Deferred firing with one, or None (nothing to answer). Answers go out whenever they are ready: the remoting
protocol matches them by opaque. Requests with the one-way bit are never answered.
"""

import itertools
import json
from collections import deque

from twisted.internet import defer, task
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.idle import IdleWatch
from mqserver.runtime.output import Output, no_delay
from mqserver.wiretap import OFF, tamper_output

from protocols.remoting import codes
from protocols.remoting.codec import RemotingProtocolError, decode_frame, encode
from protocols.remoting.framing import FrameDecoder, split_frames
from protocols.remoting.messages import RemotingCommand, make_response


_RESPONSE = codes.FLAG_RESPONSE
_ONEWAY = codes.FLAG_ONEWAY

#: Bytes of answers one read may gather before they are handed to the transport (which
#: then says whether the peer keeps up): a 300-byte PULL is answered with up to 1 MiB, so
#: a read of pipelined PULLs could otherwise gather hundreds of MiB.
GATHER_LIMIT = 256 << 10


def error(request, code, remark):
    """Return an error response to C{request}."""
    return make_response(request, code, remark=remark)


def ok(request, ext_fields=None, body=b"", remark=None):
    """Return a SUCCESS response to C{request}; every ext field value becomes a string."""
    ext = {k: str(v) for k, v in ext_fields.items()} if ext_fields else None
    return make_response(request, codes.SUCCESS, remark=remark, ext_fields=ext, body=body)


def json_body(obj):
    """Encode a response body as compact JSON with string keys."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def command_fields(cmd):
    """Return the trace's fields of remoting frame C{cmd}."""
    return {"code": cmd.code, "opaque": cmd.opaque, "flag": cmd.flag,
            "language": cmd.language, "version": cmd.version, "remark": cmd.remark,
            "ext": cmd.ext_fields, "body": len(cmd.body),
            "serialize": codes.SERIALIZE_TYPE_NAMES.get(cmd.serialize_type)}


def response_code(value):
    """Return the response code a fault rule's C{respond} value names: a number, or a
    name in ResponseCode (C{SYSTEM_BUSY}); raise ValueError for anything else."""
    if value.lstrip("-").isdigit():
        code = int(value)
        if -(1 << 31) <= code < 1 << 31:
            return code
    else:
        for code, name in codes.RESPONSE_NAMES.items():
            if name == value.upper():
                return code
    raise ValueError(f"respond wants a RocketMQ response code (a number or a name such as "
                     f"SYSTEM_BUSY), not {value!r}")


#: The fault actions a remoting door applies.
FAULT_ACTIONS = ("respond", "delay", "drop", "close", "split", "corrupt")


def check_fault(rule):
    """Raise ValueError when a remoting door cannot apply fault rule C{rule}."""
    if rule.action not in FAULT_ACTIONS:
        raise ValueError(f"door {rule.door} cannot {rule.action} "
                         f"(it can: {', '.join(FAULT_ACTIONS)})")
    if rule.action == "respond":
        response_code(rule.value)


def fault_response(request, rule):
    """Return the answer fault rule C{rule} (respond) gives C{request}: its response
    code, with its remark or one saying a fault rule made it."""
    code = response_code(rule.value)
    return error(request, code, rule.remark or f"[FAULT] rule {rule.id}: "
                 f"{codes.RESPONSE_NAMES.get(code, code)} injected by mqserver")


class BadRequest(Exception):
    """A request that cannot be served; answered with C{code} and the text."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


def field(request, name, default=None, short=None):
    """Return ext field C{name} (or its short V2 alias) as a string, or C{default}."""
    ext = request.ext_fields
    v = ext.get(name)
    if v is None and short is not None:
        v = ext.get(short)
    return default if v is None else v


def to_int(value, name, default=None):
    """Return ext field value C{value} (named C{name}) as an int, or C{default} when it is
    missing; raise L{BadRequest} when it is missing without a default, or not a number."""
    if value is None or value == "":
        if default is None:
            raise BadRequest(codes.SYSTEM_ERROR, f"the custom field <{name}> is null")
        return default
    try:
        return int(value)
    except ValueError:
        raise BadRequest(codes.SYSTEM_ERROR, f"the custom field <{name}> is not a number: {value!r}") from None


def int_field(request, name, default=None, short=None):
    """Return ext field C{name} as an int; raise L{BadRequest} when missing or bad."""
    return to_int(field(request, name, None, short), name, default)


def bool_field(request, name, short=None):
    """Return ext field C{name} as a bool: C++ sends "0"/"1", Java "true"/"false"."""
    v = field(request, name, "", short)
    return v.lower() in ("true", "1")


@implementer(IPushProducer)
class RemotingProtocol(IdleWatch, Protocol):
    """One remoting connection; subclasses map request codes to C{handlers}.

    The connection is its transport's push producer: while the peer does not read its
    answers (Twisted's output buffer is full) no more requests are read or handled, so
    pipelined requests cost at most one read's worth of answers beyond the buffer.

    A server connection whose factory has an C{idle_timeout} (seconds, from
    C{rocketmq.serverChannelMaxIdleTimeSeconds}) and a C{clock} is closed after that
    long without a byte from the peer, as RocketMQ's idle handler closes channels.

    @cvar handlers: request code -> method name.
    @cvar door_name: the front door's name fault rules match (a server door's).
    @ivar tap: the broker's L{mqserver.wiretap.WireTap} (a server door's), else one
        never active.
    """

    log = Logger()
    handlers = {}
    door_name = None
    tap = OFF
    #: a check every request passes before it is handled (or traced), or None: called
    #: with the request, it returns None to let it run, or the answer refusing it
    admit = None
    _opaques = itertools.count(1 << 30)

    def __init__(self):
        self.decoder = FrameDecoder()
        self.pending = {}  # opaque -> Deferred, for requests this side sent
        self.closed = False
        self.output = Output(self)  # one send for every reply a read produces
        self._gathered = 0  # bytes of answers gathered in this read
        self._out_full = False  # the transport's buffer is full: requests wait
        self._held = None  # requests of a read not handled yet (the buffer filled)
        self._close_after = False  # a framing error: close once the requests before it are handled
        self._frames_in = None  # while the tap is on: the raw frames of the read being handled

    def peer_str(self):
        p = self.transport.getPeer()
        return f"{getattr(p, 'host', '?')}:{getattr(p, 'port', '?')}"

    # -- input -----------------------------------------------------------------------

    def makeConnection(self, transport):
        factory = getattr(self, "factory", None)
        timeout = getattr(factory, "idle_timeout", None)
        if timeout:
            self.watch_idle(timeout, factory.clock)
        no_delay(transport)  # as the 4.9.4 broker's and client's Netty channels
        super().makeConnection(transport)
        transport.registerProducer(self, True)

    def idle_expired(self):
        self.log.info("closing idle remoting connection {peer}: nothing received for {timeout} s",
                      peer=self.peer_str(), timeout=self.factory.idle_timeout)
        self.transport.loseConnection()

    def dataReceived(self, data):
        self.active = True
        self._gathered = 0
        if self.tap.active:
            # the frames this read completes, as the client sent them (for the trace)
            self._frames_in = (deque(split_frames(self.decoder.pending() + data))
                               if self.tap.trace.active else None)
        try:
            commands = self.decoder.feed(data)
        except RemotingProtocolError as e:
            self.log.warn("closing remoting connection {peer}: {error}", peer=self.peer_str(), error=e)
            self._close_after = True
            self.output.received(self._run, e.commands)
            return
        if len(commands) == 1:
            # One request in the read (a client waiting for each answer): with nothing
            # to gather its answer with, it goes out as it is made.
            self._command(commands[0])
        elif commands:
            self.output.received(self._run, commands)

    def _send(self, data):
        self.output.write(data)
        self._gathered += len(data)
        if self._gathered > GATHER_LIMIT:
            # hand them on now: a full transport buffer pauses this producer
            self._gathered = 0
            self.output.flush()

    def _run(self, commands):
        """Handle C{commands} until the transport's buffer fills and hold the rest; then
        close if a framing error came after them."""
        it = iter(commands)
        for c in it:
            self._command(c)
            if self._out_full:
                self._held = list(it)
                return
        if self._close_after:
            self.transport.loseConnection()

    # IPushProducer: the transport's output buffer

    def pauseProducing(self):
        # the peer does not read its answers: read no more requests until they drain
        self._out_full = True
        self.transport.pauseProducing()

    def resumeProducing(self):
        self._out_full = False
        held, self._held = self._held, None
        if held is not None:
            self._gathered = 0
            self.output.received(self._run, held)
        if not self._out_full and not self._close_after and not self.closed:
            self.transport.resumeProducing()

    def stopProducing(self):
        self._held = None

    def _command(self, cmd):
        if cmd.flag & _RESPONSE:  # cmd.is_response(), without the call: every request's path
            d = self.pending.pop(cmd.opaque, None)
            if d is not None:
                d.callback(cmd)
            return
        if self.admit is not None:
            refusal = self.admit(cmd)
            if refusal is not None:
                self._reply(refusal, cmd)
                return
        if self.tap.active:
            self._tapped(cmd)
            return
        result = self._handle(cmd)
        if isinstance(result, defer.Deferred):
            result.addCallbacks(self._reply, self.request_failed, callbackArgs=(cmd,),
                                errbackArgs=(cmd,))
        else:
            self._reply(result, cmd)

    def _handle(self, cmd):
        """Run C{cmd}'s handler; return its answer (see the module docstring)."""
        name = self.handlers.get(cmd.code)
        try:
            if name is None:
                return self.unsupported(cmd)
            return getattr(self, name)(cmd)
        except BadRequest as e:
            return error(cmd, e.code, str(e))
        except Exception as e:
            self.log.failure("request {code} failed", code=cmd.code)
            return error(cmd, codes.SYSTEM_ERROR, f"{type(e).__name__}: {e}")

    def _tapped(self, cmd):
        """Handle C{cmd} while the broker's tap is on: report it and its answer to the
        trace, and handle it as a fault rule says, or as usual."""
        tap = self.tap
        names = (codes.REQUEST_NAMES.get(cmd.code) or str(cmd.code), str(cmd.code))
        raw = self._frames_in.popleft() if self._frames_in else None
        if tap.trace.active:
            tap.frame(self.door_name, self, "in", names, command_fields(cmd),
                      None if raw is None else len(raw), raw)
        rule = tap.fault(self.door_name, self, names)
        action = None if rule is None else rule.action
        if action == "drop":
            return
        if action == "close":
            self.transport.loseConnection()
            # the requests after it in this read are held as for a full buffer, and
            # never run: the connection ends
            self._out_full = True
            return
        if action == "respond":
            result = fault_response(cmd, rule)
        else:
            if action in ("split", "corrupt"):
                self.output.detach()
                tamper_output(self, rule, self.tap.clock)
            result = self._handle(cmd)
        if action == "delay":
            result = task.deferLater(self.tap.clock, rule.value, lambda answer: answer, result)
        if isinstance(result, defer.Deferred):
            result.addCallbacks(self._traced_reply, self.request_failed, callbackArgs=(cmd,),
                                errbackArgs=(cmd,))
        else:
            self._traced_reply(result, cmd)

    def _traced_reply(self, response, cmd):
        if (self.tap.trace.active and response is not None and not cmd.flag & _ONEWAY
                and not self.closed):
            frame = response if type(response) is bytes else encode(response)
            answer = decode_frame(frame)
            self.tap.frame(self.door_name, self, "out",
                           (codes.RESPONSE_NAMES.get(answer.code) or str(answer.code),
                            str(answer.code)),
                           command_fields(answer), len(frame), frame)
            response = frame
        self._reply(response, cmd)

    def request_failed(self, f, cmd):
        """Answer C{cmd}, whose handling failed with C{f}: a L{BadRequest} with its code,
        anything else (logged) with SYSTEM_ERROR."""
        if f.check(BadRequest):
            self._reply(error(cmd, f.value.code, str(f.value)), cmd)
            return
        self.log.failure("request {code} failed", f, code=cmd.code)
        self._reply(error(cmd, codes.SYSTEM_ERROR, f.getErrorMessage()), cmd)

    def _reply(self, response, cmd):
        if response is None or cmd.flag & _ONEWAY or self.closed:  # cmd.is_oneway()
            return
        self._send(response if type(response) is bytes else encode(response))

    def unsupported(self, cmd):
        """Answer an unknown request code, as RocketMQ 4.9.4's NettyRemotingAbstract does."""
        return error(cmd, codes.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")

    # -- output ----------------------------------------------------------------------

    def send_oneway(self, code, ext_fields=None, body=b""):
        """Send a one-way request (flag bit 1) to the peer."""
        if self.closed:
            return
        cmd = RemotingCommand(
            code=code, opaque=next(self._opaques) & 0x7FFFFFFF, flag=codes.FLAG_ONEWAY,
            ext_fields={k: str(v) for k, v in (ext_fields or {}).items()}, body=body,
        )
        self._send(encode(cmd))

    def request(self, code, ext_fields=None, body=b"", timeout=None, reactor=None):
        """Send a request; return a Deferred firing with the response command."""
        opaque = next(self._opaques) & 0x7FFFFFFF
        cmd = RemotingCommand(
            code=code, opaque=opaque,
            ext_fields={k: str(v) for k, v in (ext_fields or {}).items()}, body=body,
        )
        d = defer.Deferred()
        self.pending[opaque] = d
        if timeout is not None and reactor is not None:
            d.addTimeout(timeout, reactor)
        self._send(encode(cmd))
        return d

    def connectionLost(self, reason):
        self.closed = True
        self.stop_idle_watch()
        pending, self.pending = self.pending, {}
        for d in pending.values():
            d.errback(reason)
