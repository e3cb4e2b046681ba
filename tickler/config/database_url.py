"""Where a PostgreSQL database is, read from any spelling people give it, and written out for each
thing that connects to it.

A deployment with a standby names several hosts, and each tool spells that its own way: libpq's
URL (`postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write`), libpq's URL with the
hosts in the query (`?host=h1,h2&port=5432,5433`), SQLAlchemy's repeated `?host=h1:5432&host=h2:5433`,
or libpq's key=value conninfo (`host=h1,h2 port=5432,5433 dbname=db`). parse() reads all of them
into one DatabaseAddress, which renders what each consumer needs: the URL for SQLAlchemy's engine,
the URL and conninfo for psycopg (LISTEN, migrations, the command line), pgjdbc's URL for Spark,
and a line for people that names every host and never the password.

No psycopg or SQLAlchemy at import: the settings check runs this on every command.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlencode

# The URL schemes of a PostgreSQL database (tickler speaks to it with psycopg 3).
POSTGRESQL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
DEFAULT_PORT = 5432

# libpq's target_session_attrs as pgjdbc's targetServerType.
_JDBC_SERVER_TYPES = {
    "read-write": "primary",
    "primary": "primary",
    "read-only": "secondary",
    "standby": "secondary",
    "prefer-standby": "preferSecondary",
    "any": "any",
}
# libpq parameters that pgjdbc understands under the same name.
_JDBC_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class DatabaseUrlError(ValueError):
    """A database URL that cannot be read; the message says why and never holds the password."""


@dataclass(frozen=True)
class Host:
    """One server of the list: a name, an address or a unix socket directory, and its port
    (None: libpq's default)."""

    name: str
    port: int | None = None

    @property
    def is_socket(self) -> bool:
        return self.name.startswith("/") or self.name.startswith("@")

    def display(self) -> str:
        name = f"[{self.name}]" if ":" in self.name else self.name
        return f"{name or 'localhost'}:{self.port or DEFAULT_PORT}"


@dataclass(frozen=True)
class DatabaseAddress:
    """A database: its hosts in the order to try them, its name, who connects, and libpq's other
    parameters (target_session_attrs, sslmode, ...) in the order given. None: libpq's default."""

    hosts: tuple[Host, ...] = ()
    dbname: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    options: tuple[tuple[str, str], ...] = ()

    def option(self, name: str) -> str | None:
        return dict(self.options).get(name)

    def with_options(self, **options: str) -> DatabaseAddress:
        """The same database, with these parameters set (replacing ones of the same name)."""
        kept = tuple((k, v) for k, v in self.options if k not in options)
        return DatabaseAddress(self.hosts, self.dbname, self.user, self.password, kept + tuple(options.items()))

    def with_dbname(self, dbname: str) -> DatabaseAddress:
        return DatabaseAddress(self.hosts, dbname, self.user, self.password, self.options)

    # -- renderings -------------------------------------------------------------------------------

    def _query(self) -> list[tuple[str, str]]:
        query: list[tuple[str, str]] = []
        if self.hosts:
            query.append(("host", ",".join(h.name for h in self.hosts)))
            if any(h.port for h in self.hosts):
                # an empty item is libpq's default port
                query.append(("port", ",".join(str(h.port or "") for h in self.hosts)))
        return query + list(self.options)

    def _url(self, scheme: str) -> str:
        credentials = ""
        if self.user is not None or self.password is not None:
            credentials = quote(self.user or "", safe="")
            if self.password is not None:
                credentials += ":" + quote(self.password, safe="")
            credentials += "@"
        query = urlencode(self._query(), quote_via=quote, safe=",/:@")
        return f"{scheme}://{credentials}/{quote(self.dbname or '', safe='')}" + (f"?{query}" if query else "")

    def libpq_url(self) -> str:
        """libpq's URL (plain psycopg takes it), every host in the query: `postgresql://u:p@/db?host=a,b&port=1,2`."""
        return self._url("postgresql")

    def sqlalchemy_url(self) -> str:
        """The engine's URL (psycopg 3 driver); SQLAlchemy hands `host=a,b&port=1,2` to psycopg as given."""
        return self._url("postgresql+psycopg")

    def conninfo(self) -> str:
        """libpq's key=value conninfo (host=a,b port=1,2 dbname=...), values quoted as libpq reads them."""
        params: list[tuple[str, str]] = self._query()
        for name, value in (("dbname", self.dbname), ("user", self.user), ("password", self.password)):
            if value is not None:
                params.append((name, value))
        return " ".join(f"{name}={_conninfo_quote(value)}" for name, value in params)

    def jdbc_url(self, extra: Iterable[tuple[str, str]] = ()) -> str:
        """pgjdbc's URL (jdbc:postgresql://h1:p1,h2:p2/db?targetServerType=primary), without the
        credentials (they travel as properties). pgjdbc reaches servers on TCP only."""
        hosts = ",".join(h.display() for h in self.hosts) or f"localhost:{DEFAULT_PORT}"
        params: list[tuple[str, str]] = [(k, v) for k, v in self.options if k in _JDBC_PARAMS]
        attrs = self.option("target_session_attrs")
        if attrs and attrs in _JDBC_SERVER_TYPES:
            params.append(("targetServerType", _JDBC_SERVER_TYPES[attrs]))
        params += list(extra)
        query = urlencode(params)
        return f"jdbc:postgresql://{hosts}/{quote(self.database, safe='')}" + (f"?{query}" if query else "")

    @property
    def database(self) -> str:
        """The database libpq will open: the name given, else the user's name."""
        return self.dbname or self.login

    @property
    def login(self) -> str:
        """The role libpq will log in as: the user given, else the operating system's user."""
        return self.user or getpass.getuser()

    def display(self) -> str:
        """For people and logs: every host:port, the database, the user and how the server is
        chosen, never the password: `h1:5432,h2:5433/tickler as app (target_session_attrs=read-write)`."""
        hosts = ",".join(h.display() for h in self.hosts) or f"localhost:{DEFAULT_PORT}"
        line = f"{hosts}/{self.database} as {self.login}"
        attrs = self.option("target_session_attrs")
        return f"{line} (target_session_attrs={attrs})" if attrs else line

    @property
    def is_tcp(self) -> bool:
        """Whether every host is reached over TCP (no unix socket, no default)."""
        return bool(self.hosts) and not any(h.is_socket or not h.name for h in self.hosts)


def parse(text: str) -> DatabaseAddress:
    """Any spelling of a PostgreSQL database (see the module's docstring) as a DatabaseAddress.
    DatabaseUrlError (a ValueError) says what is wrong, without the password."""
    text = text.strip()
    if not text:
        raise DatabaseUrlError("the database URL is empty")
    scheme = _SCHEME.match(text)
    if scheme:
        if scheme.group(1).lower() not in POSTGRESQL_SCHEMES:
            # The scheme only: the rest of a URL may hold a password.
            raise DatabaseUrlError(
                "must be a PostgreSQL URL (postgresql://user:password@host:port/database) or libpq's "
                f"key=value conninfo (host=a,b port=5432 dbname=...), not a {scheme.group(1)}:// one"
            )
        return _parse_url(text[scheme.end() :])
    if "=" not in text:
        raise DatabaseUrlError(
            "must be a PostgreSQL URL (postgresql://user:password@host:port/database) or libpq's key=value "
            "conninfo (host=a,b port=5432 dbname=...)"
        )
    return _parse_conninfo(text)


def _parse_url(rest: str) -> DatabaseAddress:
    rest, _, _fragment = rest.partition("#")
    rest, _, query_text = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    user = password = None
    if at:
        raw_user, colon, raw_password = userinfo.partition(":")
        user = unquote(raw_user) or None
        password = unquote(raw_password) if colon else None
    hosts = [_host_port(item, where="in the URL") for item in hostlist.split(",")] if hostlist else []
    dbname = unquote(path) or None
    options: list[tuple[str, str]] = []
    query_hosts: list[str] = []
    query_ports: list[str] = []
    for name, value in parse_qsl(query_text, keep_blank_values=True):
        if name == "host":
            query_hosts += value.split(",")
        elif name == "port":
            query_ports += value.split(",")
        elif name == "dbname":
            dbname = value or dbname
        elif name == "user":
            user = value or user
        elif name == "password":
            password = value
        else:
            options.append((name, value))
    if query_hosts:
        # the query's hosts replace the URL's, as libpq reads them; `host=h:p` is SQLAlchemy's spelling
        hosts = [_query_host(item) for item in query_hosts]
    if query_ports:
        if not hosts:
            hosts = [Host("")]
        if any(h.port for h in hosts):
            raise DatabaseUrlError("gives ports both as host:port and as port=; use one of the two")
        hosts = _with_ports(hosts, query_ports)
    return DatabaseAddress(tuple(hosts), dbname, user, password, tuple(options))


def _parse_conninfo(text: str) -> DatabaseAddress:
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = {name: str(value) for name, value in conninfo_to_dict(text).items() if value is not None}
    except ProgrammingError:
        # libpq's message may quote the text, password and all
        raise DatabaseUrlError(
            "is not libpq's key=value conninfo (host=a,b port=5432 dbname=... target_session_attrs=read-write)"
        ) from None
    hosts: list[Host] = []
    if "host" in info:
        hosts = [Host(name.strip()) for name in info.pop("host").split(",")]
    if "port" in info:
        hosts = _with_ports(hosts or [Host("")], info.pop("port").split(","))
    dbname, user, password = info.pop("dbname", None), info.pop("user", None), info.pop("password", None)
    return DatabaseAddress(tuple(hosts), dbname, user, password, tuple(info.items()))


def _host_port(item: str, *, where: str) -> Host:
    """`host`, `host:port`, `[v6]` or `[v6]:port`, percent-decoded."""
    item = item.strip()
    if item.startswith("["):
        name, bracket, after = item[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise DatabaseUrlError(f"has a malformed IPv6 host {where}")
        return Host(unquote(name), _port(after[1:]) if after else None)
    name, colon, port = item.partition(":")
    return Host(unquote(name), _port(port) if colon else None)


def _query_host(item: str) -> Host:
    item = item.strip()
    if item.startswith(("/", "@")) or item.count(":") > 1:
        return Host(item)  # a socket directory, or a bare IPv6 address
    return _host_port(item, where="in host=")


def _with_ports(hosts: list[Host], ports: list[str]) -> list[Host]:
    if len(ports) == 1:
        ports = ports * len(hosts)  # one port for every host, as libpq takes it
    if len(ports) != len(hosts):
        raise DatabaseUrlError(f"names {len(hosts)} host(s) but {len(ports)} port(s); give one port, or one per host")
    return [Host(h.name, _port(p)) for h, p in zip(hosts, ports, strict=True)]


def _port(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        # not quoted back: in a mistyped URL, what stands where the port goes may be the password
        raise DatabaseUrlError("has a port that is not a number from 1 to 65535")
    return int(text)


def _conninfo_quote(value: str) -> str:
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
