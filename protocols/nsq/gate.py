"""nsqd's TLS policy and AUTH on a V2 connection, mixed into L{NsqdProtocol}.

Only a node with ``nsq.tlsRequired`` or ``nsq.authHttpAddresses`` gates its commands:
the protocol's C{_run} is then replaced, per connection, by L{SecurityGate._gated_run},
so an open node's publish path does no extra work.
"""

from dataclasses import replace

from twisted.internet.interfaces import ISSLTransport

from protocols.nsq import errors as E
from protocols.nsq.codec import response
from protocols.nsq.messages import Dpub, Identify, Invalid, Mpub, Pub, Sub

_AUTHED = (Pub, Mpub, Dpub, Sub)


class SecurityGate:
    """TLS upgrade, the TLS-required policy and AUTH for an nsqd V2 connection.

    @ivar tls: True once the connection runs TLS (IDENTIFY C{tls_v1}, or an C{ssl:}
        listener).
    @ivar auth_state: the L{protocols.nsq.auth.AuthState} of this connection's secret.
    """

    tls = False
    auth_state = None
    _secret = ""
    _held = None  # commands waiting for an auth server's answer
    #: True once L{_gated_run} replaced C{_run}: the protocol's PUB shortcut then yields.
    gated = False

    def _install_gate(self):
        node = self.node
        if ISSLTransport.providedBy(self.transport):
            self.tls = True  # an ssl: listener: TLS from the first byte
        if (node.tls_required and not self.tls) or node.auth is not None:
            self._run = self._gated_run
            self.gated = True

    def _gated_run(self, cmd):
        if self._held is not None:
            self._held.append(cmd)
            return
        kind = type(cmd)
        if kind is Invalid and not cmd.in_sync:
            type(self)._run(self, cmd)  # framing lost (bad magic, bad size): that error first
            return
        if self.node.tls_required and not self.tls and kind is not Identify:
            # nsqd checks the TLS policy before anything else but IDENTIFY.
            self._fail(E.tls_required(cmd.verb))
            return
        if (self.node.auth is not None and kind in _AUTHED
                and cmd.verb in self._ALLOWED[self.state]
                and not (kind is Sub and self.settings.heartbeat_interval_ms <= 0)):
            state = self.auth_state
            if state is None:
                self._fail(E.auth_first(cmd.verb))
                return
            if state.expired(self.reactor.seconds()):
                self._held = [cmd]
                self._ask_auth().addCallback(self._refreshed)
                return
            channel = cmd.channel if kind is Sub else ""
            if not state.allows(cmd.topic, channel):
                self._fail(E.unauthorized(cmd.verb, cmd.topic, channel))
                return
        type(self)._run(self, cmd)

    # -- TLS -----------------------------------------------------------------------------

    def identify_server(self):
        """The server settings IDENTIFY negotiates against: no second TLS layer on a
        connection that already runs TLS."""
        server = self.node.server
        if self.tls and server.tls_available:
            return replace(server, tls_available=False)
        return server

    def _start_tls(self):
        """Switch to TLS now: what was written so far goes out in the clear first."""
        self.output.start_tls(self.node.tls_options)
        self.tls = True
        if self.decoder._buf:  # nsqd reads afresh from the TLS connection too
            self.decoder._buf.clear()

    # -- AUTH ----------------------------------------------------------------------------

    def do_auth(self, cmd):
        if self.auth_state is not None:
            raise E.auth_already_set()
        if self.node.auth is None:
            raise E.auth_disabled()
        self._secret = cmd.secret.decode("utf-8", "replace")
        self._held = []
        d = self._ask_auth()

        def answer(state):
            if state is None:
                return self._fatal_later(E.auth_failed())
            if not state.authorizations:
                self._dead_input = True
                return self._fatal_later(E.auth_no_authorizations())
            self._release()
            return response(state.reply())

        self._answer(d.addCallback(answer))

    def _ask_auth(self):
        """Query the auth servers while reading stays paused; fires with the new
        L{AuthState}, or None (then the connection is failing) if none answered well."""
        self.transport.pauseProducing()
        peer = self.transport.getPeer()
        d = self.node.auth.query(getattr(peer, "host", ""), self.tls, self._secret)

        def got(state):
            self.auth_state = state
            return state

        def failed(f):
            self.log.warn("NSQ AUTH failed for {peer}: {why}", peer=self.remote_address,
                          why=f.getErrorMessage())
            self._dead_input = True
            self._held = None
            return None

        return d.addCallbacks(got, failed)

    def _refreshed(self, state):
        if state is None:
            self._answer(self._fatal_later(E.auth_failed()))
            return
        self._release()

    def _release(self):
        held, self._held = self._held, None
        if not self._dead and not self._read_paused:
            self.transport.resumeProducing()
        for cmd in held or ():
            if self._dead_input or self._dead:
                return
            self._run(cmd)
