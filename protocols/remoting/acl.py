"""RocketMQ 4.9's plain ACL on the broker door (``rocketmq.aclEnable``).

Accounts come from a file in the ``plain_acl.yml`` format: ``globalWhiteRemoteAddresses``
and ``accounts`` (accessKey, secretKey, whiteRemoteAddress, admin, defaultTopicPerm,
defaultGroupPerm, topicPerms and groupPerms as ``name=DENY|PUB|SUB|PUB|SUB``). Every
request is checked before its handler runs, in the broker's order: a global white
address passes; then the AccessKey must name an account; the account's white address
passes; else the Signature must be the HmacSHA1 (base64) of the account's secretKey
over the values of the other extFields, sorted by key, followed by the body; then admin
request codes need an admin account and each resource the request touches (topics, and
groups as their ``%RETRY%`` topics) needs its PUB or SUB permission.

A refusal is answered as the 4.9 broker answers an exception thrown by its ACL hook:
SYSTEM_ERROR with the exception and its first stack frame as the remark. The file is
read again when it changes (checked at most every C{rocketmq.aclCheckIntervalMs}).
"""

import base64
import hashlib
import hmac
import ipaddress
import json

import yaml
from twisted.logger import Logger

from protocols.remoting import codes
from protocols.remoting.server import error

DENY, ANY, PUB, SUB = 1, 2, 4, 8
_PERMS = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}
RETRY = "%RETRY%"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
ADMIN_CODES = frozenset({codes.UPDATE_AND_CREATE_TOPIC, codes.UPDATE_BROKER_CONFIG,
                         codes.DELETE_TOPIC_IN_BROKER, codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                         codes.DELETE_SUBSCRIPTIONGROUP})
_UNSIGNED = ("Signature", "_UNIQUE_KEY_QUERY")  # MixAll.UNIQUE_MSG_QUERY_FLAG
_EXC = "org.apache.rocketmq.acl.common.AclException: "
_MGR = "org.apache.rocketmq.acl.plain.PlainPermissionManager"


class AclError(Exception):
    """A refused request; C{where} is the 4.9.4 frame that threw it, for the remark."""

    def __init__(self, text, where="validate(PlainPermissionManager.java:663)"):
        super().__init__(text)
        self.where = where

    def remark(self):
        return f"{_EXC}{self}, {_MGR}.{self.where}"


class AclConfigError(ValueError):
    """The ACL file cannot be used."""


# -- addresses -------------------------------------------------------------------------

def address_matcher(pattern):
    """Return a predicate on an IPv4 address string for one whiteRemoteAddress value:
    blank matches nothing; ``*`` everything; ``a.b.c.{x,y}``, ``a,b`` (a list), octets
    of ``*`` or ``n-m`` (``192.168.*``, ``10.1.1.1-50``); else one exact address."""
    p = str(pattern or "").strip()
    if not p:
        return lambda ip: False
    if p in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return lambda ip: True
    if p.endswith("}"):
        head, _, last = p.rpartition(".")
        if not last.startswith("{") or head.count(".") != 2:
            raise AclConfigError(f"bad white address {p!r}")
        allowed = {f"{head}.{x.strip()}" for x in last[1:-1].split(",")}
        return allowed.__contains__
    if "," in p:
        allowed = {x.strip() for x in p.split(",")}
        return allowed.__contains__
    if "*" in p or "-" in p:
        octets = p.split(".")
        octets += ["*"] * (4 - len(octets))
        if len(octets) != 4:
            raise AclConfigError(f"bad white address {p!r}")
        ranges = [_octet_range(o, p) for o in octets]

        def match(ip):
            parts = ip.split(".")
            return len(parts) == 4 and all(
                x.isdigit() and lo <= int(x) <= hi for x, (lo, hi) in zip(parts, ranges))
        return match
    try:
        one = str(ipaddress.ip_address(p))
    except ValueError:
        raise AclConfigError(f"bad white address {p!r}") from None
    return lambda ip: ip == one


def _octet_range(o, pattern):
    if o == "*":
        return 0, 255
    lo, sep, hi = o.partition("-")
    try:
        lo, hi = int(lo), int(hi if sep else lo)
    except ValueError:
        raise AclConfigError(f"bad white address {pattern!r}") from None
    if not 0 <= lo <= hi <= 255:
        raise AclConfigError(f"bad white address {pattern!r}")
    return lo, hi


# -- the file --------------------------------------------------------------------------

def _perm(text):
    return _PERMS.get(str(text).strip(), DENY) if text is not None else DENY


def _resources(items, group):
    out = {}
    for item in items or []:
        name, sep, perm = str(item).partition("=")
        if not sep or not name.strip():
            kind = "group" if group else "topic"
            raise AclConfigError(f"Parse resource permission failed for {kind}:{item}")
        out[(RETRY + name.strip()) if group else name.strip()] = _perm(perm)
    return out


class Account:
    """One account of the ACL file."""

    def __init__(self, doc):
        ak, sk = doc.get("accessKey"), doc.get("secretKey")
        if ak is None or sk is None or len(str(ak)) <= 6 or len(str(sk)) <= 6:
            raise AclConfigError(f"The accessKey={ak} and secretKey={sk} cannot be null "
                                 "and length should longer than 6")
        self.access_key = str(ak)
        self.secret_key = str(sk).encode("utf-8")
        self.white = address_matcher(doc.get("whiteRemoteAddress"))
        self.admin = bool(doc.get("admin", False))
        self.default_topic = _perm(doc.get("defaultTopicPerm"))
        self.default_group = _perm(doc.get("defaultGroupPerm"))
        self.perms = {**_resources(doc.get("topicPerms"), False),
                      **_resources(doc.get("groupPerms"), True)}


def load_file(path):
    """Return (global white matchers, accessKey -> L{Account}) of an ACL file."""
    try:
        with open(path, "rb") as f:
            doc = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        raise AclConfigError(f"{path} is not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise AclConfigError(f"{path} is not a YAML mapping")
    white = [address_matcher(a) for a in doc.get("globalWhiteRemoteAddresses") or []]
    accounts = {}
    for a in doc.get("accounts") or []:
        acct = Account(a)
        accounts[acct.access_key] = acct
    return white, accounts


# -- requests --------------------------------------------------------------------------

def sign(secret_key, ext_fields, body):
    """The Signature a client sends: base64(HmacSHA1(secretKey, the values of every
    extField but Signature, sorted by key, as UTF-8, then the body))."""
    content = "".join(v for k, v in sorted(ext_fields.items()) if k not in _UNSIGNED)
    mac = hmac.new(secret_key, content.encode("utf-8") + (body or b""), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def _retry(group):
    return None if group is None else RETRY + group


def resources(cmd):
    """Return {resource: permission needed} of a request, as the 4.9 broker reads it."""
    ext, code, need = cmd.ext_fields, cmd.code, {}

    def add(name, perm):
        if name is not None:
            need[name] = perm

    if code == codes.SEND_MESSAGE or code == codes.SEND_MESSAGE_V2:
        topic = ext.get("topic" if code == codes.SEND_MESSAGE else "b")
        if topic is not None and topic.startswith(RETRY):
            add(_retry(ext.get("group" if code == codes.SEND_MESSAGE else "a")), SUB)
        else:
            add(topic, PUB)
    elif code == codes.CONSUMER_SEND_MSG_BACK:
        add(_retry(ext.get("group")), SUB)
    elif code == codes.PULL_MESSAGE:
        add(ext.get("topic"), SUB)
        add(_retry(ext.get("consumerGroup")), SUB)
    elif code == codes.QUERY_MESSAGE:
        add(ext.get("topic"), SUB)
    elif code == codes.HEART_BEAT:
        try:
            data = json.loads(cmd.body or b"{}")
            for c in data.get("consumerDataSet") or []:
                add(_retry(c.get("groupName")), SUB)
                for s in c.get("subscriptionDataSet") or []:
                    add(s.get("topic"), SUB)
        except (ValueError, AttributeError, TypeError) as e:
            raise AclError(f"heartbeat body: {e}", "parse(PlainAccessValidator.java:143)") from None
    elif code in (codes.UNREGISTER_CLIENT, codes.GET_CONSUMER_LIST_BY_GROUP):
        add(_retry(ext.get("consumerGroup")), SUB)
    elif code == codes.UPDATE_CONSUMER_OFFSET:
        add(_retry(ext.get("consumerGroup")), SUB)
        add(ext.get("topic"), SUB)
    return need


def allowed(needed, owned):
    """Permission.checkPermission of RocketMQ 4.9."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


class PlainAcl:
    """The ACL of one broker door, read from C{path} and re-read when it changes."""

    log = Logger()

    def __init__(self, path, clock, check_interval=5.0):
        self.path = path
        self._clock = clock
        self._interval = check_interval
        self._next_check = 0.0
        self._digest = None
        self.white, self.accounts = [], {}
        self._reload()

    def _reload(self):
        # As 4.9's AclFileWatchService: compare the file's MD5 at each check (a
        # timestamp can miss a rewrite within its granularity).
        try:
            with open(self.path, "rb") as f:
                digest = hashlib.md5(f.read()).digest()
        except OSError as e:
            if self._digest is None:
                raise AclConfigError(f"ACL file {self.path}: {e}") from None
            return  # gone for a moment (an editor replacing it): keep the rules
        if digest == self._digest:
            return
        first, self._digest = self._digest is None, digest  # a broken file is logged once
        try:
            self.white, self.accounts = load_file(self.path)
        except (OSError, ValueError) as e:
            if first:
                raise AclConfigError(f"ACL file {self.path}: {e}") from None
            self.log.error("ACL file {path} not reloaded (the previous one stays): {e}",
                           path=self.path, e=e)
            return
        self.log.info("ACL file {path} loaded: {n} accounts", path=self.path, n=len(self.accounts))

    def validate(self, cmd, ip):
        """Raise L{AclError} unless the request C{cmd} from address C{ip} may run."""
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self._interval
            self._reload()
        for w in self.white:
            if w(ip):
                return
        ext = cmd.ext_fields
        ak = ext.get("AccessKey")
        if ak is None:
            raise AclError("No accessKey is configured")
        acct = self.accounts.get(ak)
        if acct is None:
            raise AclError(f"No acl config for {ak}", "validate(PlainPermissionManager.java:667)")
        if acct.white(ip):
            return
        need = resources(cmd)  # parse() runs before validate() in the broker
        offered = ext.get("Signature", "").encode("utf-8", "replace")
        if not hmac.compare_digest(sign(acct.secret_key, ext, cmd.body).encode(), offered):
            raise AclError(f"Check signature failed for accessKey={ak}",
                           "validate(PlainPermissionManager.java:683)")
        if need.get(TRACE_TOPIC) == PUB:
            return
        self._check_perm(cmd.code, need, acct)

    @staticmethod
    def _check_perm(code, need, acct):
        if code in ADMIN_CODES and not acct.admin:
            raise AclError(f"Need admin permission for request code={code}, but accessKey="
                           f"{acct.access_key} is not", "checkPerm(PlainPermissionManager.java:580)")
        if not need or (acct.admin and not acct.perms):
            return
        for resource, perm in need.items():
            group = resource.startswith(RETRY)
            owned = acct.perms.get(resource)
            line = 610
            if owned is None:
                owned, line = (acct.default_group if group else acct.default_topic), 605
            if not allowed(perm, owned):
                what = f"group:{resource[len(RETRY):]}" if group else f"topic:{resource}"
                raise AclError(f"No default permission for {what}",
                               f"checkPerm(PlainPermissionManager.java:{line})")

    def refusal(self, cmd, ip):
        """Return the answer refusing the request C{cmd} from address C{ip} (logged), or
        None when it may run."""
        try:
            self.validate(cmd, ip)
        except AclError as e:
            self.log.info("ACL refused request {code} from {peer}: {e}", code=cmd.code, peer=ip, e=e)
            return error(cmd, codes.SYSTEM_ERROR, e.remark())
        return None


def make_acl(config, reactor):
    """Return the L{PlainAcl} of a broker door's config, or None when ACL is off."""
    if not config["rocketmq.aclEnable"]:
        return None
    return PlainAcl(config["rocketmq.aclFile"], reactor.seconds,
                    config["rocketmq.aclCheckIntervalMs"] / 1000.0)
