"""What goes into a store write and what comes out of it: L{Message}, L{PutResult}, and
L{NullState}, the state machine of a store that has no broker over it."""

from mqserver.message import Message, PutResult

__all__ = ["Message", "NullState", "PutResult"]


class NullState:
    """A state machine that ignores admin records (for store-only use and tests)."""

    def apply_record(self, view, replaying):
        pass

    def snapshot_state(self):
        return {}

    def restore_state(self, state):
        pass

    def begin_full_replay(self):
        pass

    def forget_after(self, event_id):
        pass
