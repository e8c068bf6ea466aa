"""The agent endpoint: OpenAI's chat-completions API on trainer rank 0, one key per episode, one sampled turn a call.
The Responses API (`/v1/responses`, the OpenAI Agents SDK's default) is the same turn in other shapes
(rlkit.agent.openai_responses).

An unmodified agent program (the official `openai` client, or anything that speaks its API) is pointed at
`base_url(key)`: `http://127.0.0.1:PORT/e/<key>/v1`. The key is the episode's own (random, given to that episode only;
it may also come as `Authorization: Bearer <key>` on `/v1/...`): a call without a live key is refused before its body
is read, so two concurrent episodes never see each other's turns and no other user of the node can sample.

Each call is one turn of the episode's token-exact trajectory (rlkit.agent.trajectory). The first call's messages
(with its tools) are rendered once by the model's chat template; a later call must repeat the conversation as it
stands (the reply included, as rlkit gave it) and add only tool results or user messages, which are inserted as the
template writes them and masked out of the loss, exactly as `ctx.insert_messages` does for rlkit's own workflows.
A call that rewrites earlier turns starts a new trajectory from its messages (the episode trains on the last one) and
is counted (`agent/openai_segments`); the conversation is never silently tokenized again. The turn itself is sampled
by `ctx.generate`: the least-busy live server, no request during a weight push, tagged with its weight version.
A call with `stream: true` is the same turn, sampled whole, then sent as OpenAI's chunks (rlkit.agent.openai_stream)
or, on the Responses route, as the Responses API's events (rlkit.agent.openai_responses_stream).

The same key also serves the token-level route verifiers' train client calls, `/e/<key>/inference/v1/generate`
(rlkit.agent.token_route): token ids in and out, the turns joined into the same kind of trajectory.

The server runs on the rollout controller's own event loop (uvicorn in a non-main thread installs no signal handlers,
so the trainer's SIGTERM handling is untouched) and binds to the loopback only: agent programs run on this node.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlkit import untrusted_json
from rlkit.agent.chat import render_prompt, template_takes_tools
from rlkit.agent.context import EpisodeContext
from rlkit.agent.openai_protocol import (
    ChatRequest,
    OpenAIError,
    assistant_message,
    completion_body,
    continues,
    models_body,
    parse_request,
    template_message,
)
from rlkit.agent.openai_responses import ResponseStore, parse_responses, response_body
from rlkit.agent.openai_responses_stream import ResponseEvents
from rlkit.agent.openai_stream import DONE, completion_chunks, sse_stream
from rlkit.agent.token_route import generate_tokens, parse_token_request
from rlkit.agent.trajectory import encode_within

MAX_BODY_BYTES = 16 << 20  # a conversation of a long episode is well under this; more is refused unread
SERVED_MODEL = "policy"  # what /v1/models lists; any model name is accepted in a call (one model is served)


@dataclass
class AgentSession:
    """One episode's side of the endpoint: its context, the conversation as the endpoint gave it, and its counts."""

    key: str
    ctx: EpisodeContext
    takes_tools: bool
    known: list[dict[str, Any]] | None = None  # the conversation so far (normalized), ending with the last reply
    tools: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    segments: int = 0  # trajectories started: 1, plus one per call that rewrote earlier turns
    refused: int = 0  # calls answered with an error
    failure: BaseException | None = None  # what failed on rlkit's side (a server pool error): the episode's error
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    responses: ResponseStore = field(default_factory=ResponseStore)  # what previous_response_id may name

    async def chat(self, request: ChatRequest) -> dict[str, Any]:
        """One call, one turn (calls of one episode are taken one at a time, in arrival order)."""
        from jinja2 import TemplateError  # what apply_chat_template raises (transformers' dependency)

        async with self.lock:
            self._live()
            self.calls += 1
            try:
                if self.known is not None and request.tools == self.tools and continues(self.known,
                                                                                         request.messages):
                    fits = self.ctx.insert_messages([template_message(m) for m in request.messages[len(self.known):]])
                else:
                    fits = await self._start(request)
            except TemplateError as exc:  # the agent's conversation, not rlkit, is at fault: a 400, not the step's
                raise OpenAIError(400, f"the model's chat template refuses these messages: {exc}",
                                  param="messages", code="invalid_messages") from None
            settings: dict[str, Any] = {}
            if request.max_tokens is not None:
                settings["max_new_tokens"] = request.max_tokens
            if request.stop is not None:
                settings["stop"] = request.stop
            turn = await self.ctx.generate(**settings) if fits else None
            call_id = f"chatcmpl-{self.key[:8]}-{self.calls}"
            prompt_tokens = self.ctx.builder.total_tokens - (len(turn.token_ids) if turn else 0)
            if turn is None:  # a limit of the episode (turns, tokens): nothing more is sampled, as OpenAI's `length`
                body = completion_body(None, "", "length", call_id=call_id, model=SERVED_MODEL,
                                       prompt_tokens=prompt_tokens, completion_tokens=0)
            else:
                if request.parse_tool_calls:  # the calls the model made (the program runs them: their errors and time
                    self.ctx.tally.calls += len(turn.parsed.calls)  # are its own) and those it wrote unreadably
                    self.ctx.tally.add_unparsed(len(turn.parsed.problems))
                body = completion_body(turn.parsed if request.parse_tool_calls else None, turn.text,
                                       "length" if turn.finish_reason == "length" else "stop", call_id=call_id,
                                       model=SERVED_MODEL, prompt_tokens=prompt_tokens,
                                       completion_tokens=len(turn.token_ids))
            self.known = [*request.messages, assistant_message(body)]
            self.tools = request.tools
            return body

    async def _start(self, request: ChatRequest) -> bool:
        """A new trajectory from the call's messages (the first call, or one that rewrote earlier turns). Rendered and
        tokenized in a worker thread: on the loop that serves every episode, a 25k-token conversation of the tiny
        tokenizer stalled it ~50 ms, eight at once ~600 ms; in a thread its longest stall was 5 and 40 ms (the
        tokenizer's `encode` releases the GIL)."""
        text, ids = await asyncio.to_thread(self._prompt, request)
        self._live()  # the episode may have ended meanwhile (its program timed out): nothing more is sampled for it
        self.ctx.restart(ids, text)  # the episode changes on the loop, once the call's prompt is known to fit
        self.segments += 1
        return True

    def _live(self) -> None:
        if self.closed:
            raise OpenAIError(401, "this episode has ended; its key is no longer valid", code="invalid_api_key",
                              kind="authentication_error")

    def _prompt(self, request: ChatRequest) -> tuple[str, list[int]]:
        """The call's messages as the template writes them, and their token ids (thread-safe: reads only)."""
        tokenizer = self.ctx.tokenizer
        text = render_prompt(tokenizer, [template_message(m) for m in request.messages], request.tools,
                             takes_tools=self.takes_tools)
        limit = self.ctx.services.limits.max_total_tokens
        ids = encode_within(tokenizer, text, limit - 1)
        if ids is None:
            raise OpenAIError(400, f"the conversation is more than {limit - 1} tokens once the chat template and the "
                                   f"tools are added; an episode may hold {limit} (rollout.agent.engine_max_tokens or "
                                   "the servers' context), leaving no room for a turn", param="messages",
                              code="context_length_exceeded")
        return text, ids


class AgentEndpoint:
    """The HTTP side (Starlette on uvicorn); `open` a session per episode, `close` it when its program ends."""

    def __init__(self) -> None:
        self.sessions: dict[str, AgentSession] = {}
        self.port = 0
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._takes_tools: bool | None = None  # whether the run's chat template renders tools=

    async def start(self) -> None:
        """Serve on 127.0.0.1 (a free port) from the running loop; returns once it accepts connections."""
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        routes = [Route(path, self._chat, methods=["POST"]) for path in ("/v1/chat/completions",
                                                                          "/e/{key}/v1/chat/completions")]
        routes += [Route(path, self._responses, methods=["POST"]) for path in ("/v1/responses",
                                                                               "/e/{key}/v1/responses")]
        routes += [Route(path, self._models, methods=["GET"]) for path in ("/v1/models", "/e/{key}/v1/models")]
        routes += [Route(path, self._tokens, methods=["POST"]) for path in ("/inference/v1/generate",
                                                                            "/e/{key}/inference/v1/generate")]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(Starlette(routes=routes), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError("the agent endpoint stopped before it started")
            await asyncio.sleep(0.01)
        print(f"rlkit agent endpoint: serving the OpenAI chat-completions and responses APIs on "
              f"http://127.0.0.1:{self.port} (one key per episode)", flush=True)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait([self._task], timeout=5)

    def open(self, ctx: EpisodeContext) -> AgentSession:
        if self._takes_tools is None:  # one tokenizer per run: asked once
            self._takes_tools = template_takes_tools(ctx.tokenizer)
        session = AgentSession(secrets.token_urlsafe(24), ctx, self._takes_tools)
        self.sessions[session.key] = session
        return session

    def close(self, session: AgentSession) -> None:
        session.closed = True
        self.sessions.pop(session.key, None)

    def base_url(self, session: AgentSession) -> str:
        return f"http://127.0.0.1:{self.port}/e/{session.key}/v1"

    def _session(self, request: Any) -> AgentSession:
        key = request.path_params.get("key")
        if key is None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            key = token.strip() if scheme.lower() == "bearer" else ""
        session = self.sessions.get(key or "")
        if session is None:
            raise OpenAIError(401, "no live episode has this key: use the base URL (or key) your episode was given",
                              code="invalid_api_key", kind="authentication_error")
        return session

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        try:
            self._session(request)
        except OpenAIError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        return JSONResponse(models_body(SERVED_MODEL))

    async def _chat(self, request: Any) -> Any:
        async def call(session: AgentSession, body: Any, sampling: dict[str, Any]) -> Any:
            chat = parse_request(body, sampling)
            completion = await session.chat(chat)
            if not chat.stream:
                return completion
            return _streamed(session, completion_chunks(completion, include_usage=chat.include_usage),
                             lambda message: [OpenAIError(500, message, kind="server_error").body()])

        return await self._serve(request, call)

    async def _responses(self, request: Any) -> Any:
        """OpenAI's Responses API (rlkit.agent.openai_responses): the chat route's turn, in the Responses shapes."""
        async def call(session: AgentSession, body: Any, sampling: dict[str, Any]) -> Any:
            parsed = parse_responses(body, sampling, session.responses)
            try:
                completion = await session.chat(parsed.chat)
            except OpenAIError as exc:  # the session's refusals name the chat call's messages: here they are input
                exc.param = "input" if exc.param == "messages" else exc.param
                raise
            response = response_body(completion, parsed)
            session.responses.keep(response["id"], parsed, completion["choices"][0]["message"])
            if not parsed.stream:
                return response
            events = ResponseEvents(response)
            return _streamed(session, events.events(), events.failed, named=True, end=b"")

        return await self._serve(request, call)

    async def _tokens(self, request: Any) -> Any:
        """The token-level route verifiers' train client calls (rlkit.agent.token_route)."""
        async def call(session: AgentSession, body: Any, sampling: dict[str, Any]) -> dict[str, Any]:
            eos = session.ctx.tokenizer.eos_token_id
            return await generate_tokens(session, parse_token_request(body, sampling, {eos} if eos is not None
                                                                      else set()))

        return await self._serve(request, call)

    async def _serve(self, request: Any, call: Any) -> Any:
        """`call`'s answer (a JSON body, or a response of its own: a stream), its errors as OpenAI's JSON errors."""
        from starlette.responses import JSONResponse, Response

        session: AgentSession | None = None
        try:
            session = self._session(request)
            body = await _read_json(request)
            params = session.ctx.services.params  # gconfig's (eval_gconfig's for evaluation episodes)
            sampling = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
            answer = await call(session, body, sampling)
            return answer if isinstance(answer, Response) else JSONResponse(answer)
        except OpenAIError as exc:
            if session is not None:
                session.refused += 1
            return JSONResponse(exc.body(), status_code=exc.status)
        except Exception as exc:  # rlkit's side failed (servers, a trajectory check): the episode's error
            assert session is not None
            session.failure = session.failure or exc
            error = OpenAIError(500, f"rlkit could not sample this turn: {type(exc).__name__}: {exc}",
                                kind="server_error")
            return JSONResponse(error.body(), status_code=500)


def _streamed(session: AgentSession, events: Iterable[Mapping[str, Any]],
              failure: Callable[[str], Iterable[Mapping[str, Any]]], *, named: bool = False, end: bytes = DONE) -> Any:
    """The sampled turn's `events` as server-sent events (rlkit.agent.openai_stream.sse_stream); a failure once they
    started ends the stream with `failure(message)`'s events (the status is sent) and is the episode's error, as in
    `_serve`."""
    from starlette.responses import StreamingResponse

    def failed(exc: Exception) -> Iterable[Mapping[str, Any]]:
        session.failure = session.failure or exc
        return failure(f"rlkit could not stream this turn: {type(exc).__name__}: {exc}")

    async def stream() -> Any:  # an async iterator: Starlette would step a plain one in its thread pool
        for data in sse_stream(events, failed, named=named, end=end):
            yield data

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


async def _read_json(request: Any) -> Any:
    """The body as JSON, refused unread past MAX_BODY_BYTES."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
        raise OpenAIError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise OpenAIError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    try:
        return untrusted_json.loads(bytes(data))
    except ValueError as exc:
        raise OpenAIError(400, f"the request body is not JSON: {exc}") from None


class EndpointPerLoop:
    """A workflow's AgentEndpoint, one per running event loop, started by the loop's first episode: each trainer run
    gets its own rollout loop, and an endpoint (a server on its loop) cannot serve another. The workflows of agent
    programs (rlkit.agent.openai_workflow, rlkit.agent.verifiers_workflow) hold theirs through this."""

    def __init__(self) -> None:
        self._endpoint: AgentEndpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None

    def _new_loop(self) -> None:
        """Called when a new loop starts its first episode: what else lives as long as the loop's endpoint."""

    async def endpoint(self) -> AgentEndpoint:
        """The endpoint on the running loop, started by the first episode."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._endpoint, self._starting = loop, None, asyncio.Lock()
            self._new_loop()
        assert self._starting is not None
        async with self._starting:
            if self._endpoint is None:
                endpoint = AgentEndpoint()
                await endpoint.start()
                self._endpoint = endpoint
        return self._endpoint
