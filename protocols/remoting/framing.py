"""The incremental decoder of a remoting connection's bytes: whatever arrived in, whole
commands out (frames as in L{protocols.remoting.codec})."""

from protocols.remoting import codes
from protocols.remoting.codec import (
    RemotingProtocolError, decode_payload, json_frame as _json_frame,
)
from protocols.remoting.messages import RemotingCommand
from protocols.remoting.wire import (
    DEFAULT_MAX_FRAME,
    FRAME_PREFIX_STRUCT,
    LENGTH_STRUCT,
    SERIALIZE_TYPE_OFFSET,
    WORD_SIZE,
)

_LENGTH_SIZE = LENGTH_STRUCT.size
_PREFIX_SIZE = FRAME_PREFIX_STRUCT.size
# Compaction threshold: below it a consumed prefix is kept, since deleting it would cost
# more than it saves.
_COMPACT_MIN = 64 * 1024


def split_frames(data) -> list[bytes]:
    """Return the whole frames at the start of C{data} (bytes beginning at a frame
    boundary), each with its length prefix."""
    frames = []
    pos = 0
    while len(data) - pos >= _LENGTH_SIZE:
        end = pos + _LENGTH_SIZE + LENGTH_STRUCT.unpack_from(data, pos)[0]
        if end > len(data):
            break
        frames.append(data[pos:end])
        pos = end
    return frames


class FrameDecoder:
    """Incremental frame decoder: feed it bytes as they arrive, get whole commands back.

    ``max_frame`` bounds a whole frame including its 4-byte length prefix (Java's
    LengthFieldBasedFrameDecoder counts the prefix).  The announced length is checked
    as soon as its 4 bytes are in, before any of the frame is waited for.  After an
    error the decoder stays failed; drop the connection.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME):
        """Create a decoder that rejects frames longer than ``max_frame`` bytes."""
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._pos = 0  # start of the first unconsumed byte in _buffer
        self._need = 0  # total size of the frame at _pos once its length is known
        self._error: RemotingProtocolError | None = None

    def pending(self) -> bytes:
        """Return the received bytes waiting for the rest of their frame."""
        return bytes(self._buffer[self._pos:])

    def buffered(self) -> int:
        """Return how many received bytes are waiting for the rest of their frame."""
        return len(self._buffer) - self._pos

    def feed(self, data) -> list[RemotingCommand]:
        """Add ``data`` and return every command it completes, in order."""
        if self._error is not None:
            raise RemotingProtocolError(f"decoder failed earlier: {self._error}")
        buffer = self._buffer
        if not buffer and _json_frame is not None:
            # Exactly one whole frame with a JSON header within the limits and nothing
            # waiting (a client that sends a request and waits for its answer): read by
            # the C speedup from the read itself, in one call; anything it leaves is
            # read below.
            cmd = _json_frame(data, self.max_frame)
            if cmd is not None:
                return [cmd]
        if (not buffer and len(data) >= _PREFIX_SIZE
                and FRAME_PREFIX_STRUCT.unpack_from(data, 0)[0] + _LENGTH_SIZE == len(data)):
            # Exactly one whole frame and nothing waiting: decoded from the read itself,
            # without a round trip through the buffer (another serialization, a header
            # the C speedup does not read, what is wrong with the frame).
            try:
                self._check_prefix(data, len(data))
                return [decode_payload(bytes(data)[_LENGTH_SIZE:])]
            except RemotingProtocolError as exc:
                self._error = exc
                raise
        buffer += data
        commands: list[RemotingCommand] = []
        try:
            while True:
                available = len(buffer) - self._pos
                if not self._need:
                    if available < _LENGTH_SIZE:
                        break
                    self._need = self._check_prefix(buffer, available)
                if available < self._need:
                    break
                start = self._pos
                # Decode from an immutable copy: a view into the bytearray (kept alive by
                # a traceback, say) would forbid resizing it later.
                with memoryview(buffer) as view:
                    payload = bytes(view[start + _LENGTH_SIZE:start + self._need])
                commands.append(decode_payload(payload))
                self._pos = start + self._need
                self._need = 0
        except RemotingProtocolError as exc:
            exc.commands = commands
            self._error = exc
            buffer.clear()
            raise
        if self._pos == len(buffer):
            buffer.clear()
            self._pos = 0
        elif self._pos >= _COMPACT_MIN and self._pos * 2 >= len(buffer):
            del buffer[:self._pos]
            self._pos = 0
        return commands

    def _check_prefix(self, buffer: bytearray, available: int) -> int:
        """Validate the announced length (and the type byte if present); return the frame size."""
        (length,) = LENGTH_STRUCT.unpack_from(buffer, self._pos)
        size = length + _LENGTH_SIZE
        if size > self.max_frame:
            raise RemotingProtocolError(f"frame of {size} bytes exceeds the {self.max_frame}-byte limit")
        if length < WORD_SIZE:
            raise RemotingProtocolError(f"frame length {length} leaves no room for the header length")
        if available > SERIALIZE_TYPE_OFFSET:
            serialize_type = buffer[self._pos + SERIALIZE_TYPE_OFFSET]
            if serialize_type not in codes.SERIALIZE_TYPE_NAMES:
                raise RemotingProtocolError(f"unknown serialize type {serialize_type}")
        return size
