"""The states of an nsqd V2 connection and the verbs each allows."""

INIT, SUBSCRIBED, CLOSING = 0, 3, 4
#: Verbs allowed per state (anything else is the fatal "cannot <VERB> in current state").
ALLOWED = {
    INIT: {"IDENTIFY", "AUTH", "SUB", "PUB", "MPUB", "DPUB", "NOP"},
    SUBSCRIBED: {"RDY", "FIN", "REQ", "TOUCH", "CLS", "PUB", "MPUB", "DPUB", "NOP"},
    CLOSING: {"RDY", "FIN", "REQ", "TOUCH", "PUB", "MPUB", "DPUB", "NOP"},
}
