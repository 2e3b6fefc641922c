"""The nsqd release this broker speaks as: in IDENTIFY replies, C{/info}, C{/stats}
and what it tells lookupds (a module of its own so every NSQ module can name it without
importing the node)."""

VERSION = "1.3.0"
