"""`ViewServer`: one session's view, served live on 127.0.0.1.

The server reads the session from its store when it starts and again
whenever the log has grown (a page asked for after a run went on shows it).
Every request must carry the server's random token (``?token=...``, or the
form field of the same name): without it the answer is 403, and nothing is
read or written. A page lists the first turns of each run; the rest, and
each turn's details, load as they are asked for, so a long session opens
fast. The sessions of the runs' sub-agents (theirs too) are served as pages
of their own, linked from the runs that started them (`/session`); no other
session of the store is.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Final, final

import anyio

from turnfsm import _checks
from turnfsm.errors import CorruptRecord, SessionBusy
from turnfsm.persistence import (
    RunRecord,
    Session,
    SessionStore,
    holder_of,
    read_descendants,
    store_label,
)
from turnfsm.view._html import (
    Links,
    command_words,
    page,
    pass_diff,
    pass_rows,
    path_section,
    turn_detail,
    turn_rows,
)
from turnfsm.view._paths import Diagram, run_path

__all__ = ["Answer", "ViewServer"]

Answer = Callable[[str, str], str]
"""Answers a paused run: ``(action, run id) -> what happened``, as text.

The action is ``approve`` or ``reject``; the text is shown on the page.
"""

_Family = tuple[list[tuple[str, int]], dict[str, Session]]
"""The store's sessions and versions when read, and the sessions below, by id."""

_HOST: Final = "127.0.0.1"
_ACTIONS: Final = ("approve", "reject")
_MAX_FORM: Final = 4_096
_PARTS: Final = frozenset({"/turn", "/path", "/pass", "/turns", "/passes"})
"""The pages a run's parts load from (besides ``/`` and ``/session``)."""


@final
class ViewServer:
    """Serve the view of one stored session on 127.0.0.1 until stopped.

    Use it as a context manager (``with ViewServer(...) as server:``), or
    call `start` and `stop`; `url` is the page's address, token included.

    Args:
        store: Opens the store the session is kept in (called for each read,
            and the store closed after it).
        session_id: The session.
        answer: Approves or rejects a paused run (None: the page has no
            buttons, and a post is refused).
        port: The port (0: a free one).
        page_size: Turns listed per run before "more turns".
        commands: The options that the commands the page gives (approve,
            resume, abandon a run) take after the ids, as a command line
            spells them: those that find the session's store and build its
            agent (``["--store", "s.db", "--agent", "app:agent"]``).

    Raises:
        ConfigError: `port` or `page_size` is out of range, or `answer` is
            not callable.
    """

    def __init__(
        self,
        store: Callable[[], SessionStore],
        session_id: str,
        *,
        answer: Answer | None = None,
        port: int = 0,
        page_size: int = 100,
        commands: Sequence[str] = (),
    ):
        _checks.check(store, "store", _checks.callable_())
        _checks.check(answer, "answer", _checks.callable_(optional=True))
        _checks.check(port, "port", _checks.integer(low=0, high=65_535))
        _checks.check(page_size, "page_size", _checks.integer(low=1, high=100_000))
        _checks.check_id("session_id", session_id)
        self._open = store
        self.session_id = session_id
        self._answer = answer
        self._page_size = page_size
        self._commands = command_words(commands)
        self.token = secrets.token_urlsafe(24)
        self._lock = threading.Lock()
        self._drawing = threading.Lock()
        self._session: Session | None = None
        self._held: SessionBusy | None = None  # who holds its open run
        self._where = ""
        self._diagrams: dict[tuple[str, int], Diagram] = {}
        self._notice = ""
        self._family_lock = threading.Lock()
        self._family: _Family = ([], {})
        self._read_sessions: dict[str, Session] = {}  # the store's, as last read
        self._unread = ""  # why the sessions below cannot be read, if they cannot
        self._quiet = threading.Condition()  # no answer going on
        self._answering: list[str] = []
        self._httpd = ThreadingHTTPServer((_HOST, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- addresses -----------------------------------------------------
    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self._httpd.server_address[1])

    def _address(self, path: str, **query: object) -> str:
        params = urllib.parse.urlencode({**query, "token": self.token})
        return f"http://{_HOST}:{self.port}{path}?{params}"

    @property
    def url(self) -> str:
        """The page's address, its token included."""
        return self._address("/")

    def turn_url(self, run: int, turn: int) -> str:
        """The address of the details of turn `turn` (0-based) of the `run`-th run."""
        return self._address("/turn", r=run, n=turn)

    # -- running -------------------------------------------------------
    def start(self) -> ViewServer:
        """Read the session, then serve in a background thread; return self.

        Raises:
            SessionNotFound: the store holds no such session.
            StoreError: the store cannot be read.
        """
        try:
            session = self.session()
        except BaseException:
            self._httpd.server_close()  # the port is not kept
            raise
        # A run's path is replayed when the page asks for it, once the page
        # is served: replayed now, it would hold the interpreter the first
        # page needs (about half a second on a 10,000-turn run).
        del session
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="turnfsm-view", daemon=True
        )
        self._thread.start()
        return self

    @property
    def answering(self) -> tuple[str, ...]:
        """The runs the page's buttons are answering now, by id (`stop` waits)."""
        with self._quiet:
            return tuple(self._answering)

    def stop(self) -> None:
        """Stop serving, wait for the answers going on, and release the port.

        An answer carries its run on (the model, the tools): cut off, the
        run would be left unfinished, its session held. Interrupted while
        it waits (Ctrl-C), it stops at once.
        """
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        with self._quiet:
            while self._answering:
                self._quiet.wait(0.5)
        self._httpd.server_close()

    def __enter__(self) -> ViewServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- reading -------------------------------------------------------
    def session(self) -> Session:
        """The session as its log now stands (read again only when it grew).

        Raises:
            SessionNotFound: the store holds no such session.
            StoreError: the store cannot be read.
        """
        with self._lock:
            self._session, self._held = anyio.run(self._read, self._session)
            return self._session

    async def _read(self, known: Session | None) -> tuple[Session, SessionBusy | None]:
        """The session (`known` if its log did not grow), and who holds it."""
        store = self._open()
        try:
            session: Session | None = None
            if known is not None:
                infos = await store.list_sessions()
                version = next(
                    (i.version for i in infos if i.id == self.session_id), None
                )
                if version == known.version:
                    session = known
            if session is None:
                self._where = store_label(store)
                session = await Session.load(store, self.session_id)
            return session, await holder_of(session, store)
        finally:
            close = getattr(store, "aclose", None) or getattr(store, "close", None)
            if close is not None:
                await close()

    def _diagram(self, session: Session, run: RunRecord) -> Diagram:
        key = (run.run_id, len(run.events))
        with self._drawing:  # one replay at a time: a page waits for the one going
            with self._lock:
                found = self._diagrams.get(key)
            if found is None:
                found = run_path(session, run)
                with self._lock:
                    self._diagrams[key] = found
        return found

    def _below(self) -> dict[str, Session]:
        """The sessions below the served one, by id, each before its own.

        Read again only when a session of the store has changed. A damaged
        one never hides the served session: none is given then, and the
        page says why (as ``turnfsm report`` and ``sessions show`` do).

        Raises:
            StoreError: the store cannot be read.
        """
        with self._family_lock:
            self._family = anyio.run(self._read_family, self._family)
            return self._family[1]

    async def _read_family(self, known: _Family) -> _Family:
        store = self._open()
        try:
            versions = [(i.id, i.version) for i in await store.list_sessions()]
            if versions == known[0]:
                return known
            try:
                found = await read_descendants(
                    store, self.session_id, self._read_sessions
                )
            except CorruptRecord as exc:
                self._unread = str(exc)
                return versions, {}
            self._unread = ""
            return versions, {s.id: s for s in found}
        finally:
            await _close(store)

    def child_url(self, session_id: str) -> str | None:
        """The address of the page of `session_id`, a session below the served one.

        The served session's own is `url`; None for any other session.

        Raises:
            StoreError: the store cannot be read.
        """
        if session_id == self.session_id:
            return self.url
        if session_id not in self._family[1] and session_id not in self._below():
            return None
        return self._address("/session", s=session_id)

    def _sub_agent_page(self, session_id: str) -> tuple[int, str]:
        family = self._below()
        child = family.get(session_id)
        if child is None:
            return HTTPStatus.NOT_FOUND, "no such sub-agent session below this one"
        links = self._links(child.id)
        text = page(
            child,
            where=self._where,
            links=links,
            sub_agents=[*family.values()],
            commands=self._commands,
        )
        return HTTPStatus.OK, text

    def _chosen(self, session_id: str) -> Session | None:
        """The served session (`session_id` empty), or the one below it so named."""
        if not session_id:
            return self._session or self.session()
        found = self._family[1].get(session_id)
        return found if found is not None else self._below().get(session_id)

    def _links(self, of: str = "") -> Links:
        """The live page's links; `of` names a sub-agent's page (it answers nothing)."""
        where = {"s": of} if of else {}
        return Links(
            turn=lambda run, n: self._address("/turn", r=run, n=n, **where),
            more=lambda kind, run, start: self._address(
                f"/{kind}", r=run, start=start, **where
            ),
            compaction=lambda run, k: self._address("/pass", r=run, k=k, **where),
            path=lambda run: self._address("/path", r=run, **where),
            answer=None if self._answer is None or of else self._address("/answer"),
            token=self.token,
            page_size=self._page_size,
            notice="" if of else self._notice,
            unread=self._unread,
            child=self.child_url,
            held=None if of else self._held,
        )

    # -- answering (a request's thread) -------------------------------------
    def _render(self, path: str, query: dict[str, str]) -> tuple[int, str]:
        """Answer a GET of `path`: the status and the HTML."""
        if path == "/":
            session = self.session()
            below = [*self._below().values()]
            text = page(
                session,
                where=self._where,
                links=self._links(),
                sub_agents=below,
                commands=self._commands,
            )
            return HTTPStatus.OK, text
        if path == "/session":
            return self._sub_agent_page(query.get("s", ""))
        if path not in _PARTS:
            return HTTPStatus.NOT_FOUND, "no such page"
        chosen = self._chosen(query.get("s", ""))
        if chosen is None:
            return HTTPStatus.NOT_FOUND, "no such sub-agent session below this one"
        session, of = chosen, query.get("s", "")
        runs = session.runs
        try:
            run = runs[_index(query.get("r", ""))]
            if path == "/turn":
                turn = _index(query.get("n", ""))
                return HTTPStatus.OK, "".join(turn_detail(session, run, turn))
            if path == "/path":
                n = int(query["r"])
                return HTTPStatus.OK, "".join(
                    path_section(self._diagram(session, run), n, run.run_id)
                )
            if path == "/pass":
                k = _index(query.get("k", ""))
                n = int(query["r"])
                return HTTPStatus.OK, "".join(pass_diff(session, run, n, k))
            n = int(query["r"])  # "/turns" or "/passes"
            start = _index(query.get("start", ""))
            rows = turn_rows if path == "/turns" else pass_rows
            stop = start + self._page_size
            some = rows(session, run, n, start, stop, links=self._links(of))
            return HTTPStatus.OK, "".join(some)
        except (ValueError, IndexError, KeyError):
            return HTTPStatus.BAD_REQUEST, "no such run or turn"

    def _post(self, form: dict[str, str]) -> tuple[int, str]:
        """Answer the approve / reject form: the status and a message."""
        action = form.get("action", "")
        run_id = form.get("run", "")
        if self._answer is None:
            return HTTPStatus.FORBIDDEN, "this page cannot answer runs"
        if action not in _ACTIONS or not run_id:
            return HTTPStatus.BAD_REQUEST, "expected action=approve|reject and run=ID"
        with self._quiet:
            self._answering.append(run_id)
        try:
            said = self._answer(action, run_id)
        finally:
            with self._quiet:
                self._answering.remove(run_id)
                self._quiet.notify_all()
        with self._lock:
            self._notice = f"{action} {run_id}:\n{said}"
        self.session()  # read the log again: the run went on
        return HTTPStatus.SEE_OTHER, self.url


def _index(text: str) -> int:
    """A list index from a query (a negative one is no index here).

    Raises:
        ValueError: `text` is not a number from 0 up.
    """
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


async def _close(store: SessionStore) -> None:
    close = getattr(store, "aclose", None) or getattr(store, "close", None)
    if close is not None:
        await close()


def _handler(server: ViewServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "turnfsm-view"

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the command prints its own lines."""

        def _allowed(self, given: str) -> bool:
            return hmac.compare_digest(given.encode(), server.token.encode())

        def _send(self, status: int, text: str, kind: str = "text/html") -> None:
            body = text.encode("utf-8", "backslashreplace")
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if not self._allowed(query.get("token", "")):
                self._send(
                    HTTPStatus.FORBIDDEN,
                    "forbidden: the URL's token is missing or wrong",
                    "text/plain",
                )
                return
            try:
                status, text = server._render(url.path, query)
            except Exception as exc:  # one bad read must not stop the server
                self._send(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    f"{type(exc).__name__}: {exc}",
                    "text/plain",
                )
                return
            self._send(status, text, "text/html" if status == 200 else "text/plain")

        def do_POST(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= _MAX_FORM:
                self._send(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"a form of up to {_MAX_FORM} bytes, with its Content-Length",
                    "text/plain",
                )
                return
            raw = self.rfile.read(length).decode("utf-8", "replace")
            form = dict(urllib.parse.parse_qsl(raw))
            token = form.get("token") or query.get("token", "")
            if url.path != "/answer" or not self._allowed(token):
                self._send(
                    HTTPStatus.FORBIDDEN,
                    "forbidden: the token is missing or wrong",
                    "text/plain",
                )
                return
            try:
                status, text = server._post(form)
            except Exception as exc:  # reported on the page, the server goes on
                self._send(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    f"{type(exc).__name__}: {exc}",
                    "text/plain",
                )
                return
            if status == HTTPStatus.SEE_OTHER:
                self.send_response(status)
                self.send_header("Location", text)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send(status, text, "text/plain")

    return Handler
