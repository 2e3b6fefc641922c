"""The in-memory form of one remoting request or response."""

from dataclasses import dataclass, field

from protocols.remoting import codes


@dataclass
class RemotingCommand:
    """One remoting frame, request or response, independent of its serialization.

    ``ext_fields`` always maps strings to strings: the decoder stringifies the
    numbers some clients send, and every value must go out as a JSON string.
    ``remark`` is None when absent; the C++ client sends ``""``.
    """

    code: int
    language: str = codes.SERVER_LANGUAGE
    version: int = codes.SERVER_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = codes.SERIALIZE_JSON

    def is_response(self) -> bool:
        """Return True when the response bit of ``flag`` is set."""
        return bool(self.flag & codes.FLAG_RESPONSE)

    def is_oneway(self) -> bool:
        """Return True when the sender asked for no response.

        The C++ 1.2.3 client sets this bit after serializing, so its "one-way"
        requests arrive with flag 0 and this returns False for them.
        """
        return bool(self.flag & codes.FLAG_ONEWAY)


def make_response(
    request: RemotingCommand,
    code: int,
    remark: str | None = None,
    ext_fields: dict[str, str] | None = None,
    body: bytes = b"",
) -> RemotingCommand:
    """Build the response to ``request``: same opaque and serialize type, response bit set.

    The flag is fresh (response bit only), as Java servers do; language and version
    are what our servers announce (JAVA, 401).
    """
    return RemotingCommand(
        code=code,
        language=codes.SERVER_LANGUAGE,
        version=codes.SERVER_VERSION,
        opaque=request.opaque,
        flag=codes.FLAG_RESPONSE,
        remark=remark,
        ext_fields=dict(ext_fields) if ext_fields else {},
        body=body,
        serialize_type=request.serialize_type,
    )
