"""The service's memory budget for full-size images (`serve.http.memory`): its line on its own (first come, first
served, waits bounded by the deadline, refusals with a Retry-After, the pixels back however a request ends), then
through the real app with small images and a tiny budget: requests beyond it wait or get 503 with Retry-After,
never a 5xx; one request larger than the whole budget gets 413 before anything is decoded."""
from __future__ import annotations

import asyncio
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from serve.http.app import create_app
from serve.http.errors import ClientGone
from serve.http.memory import MARGIN_S, MemoryBudget, MemoryBusyError, Reservation
from serve.http.routes import stylize
from serve.settings import ServeSettings
from stylevar.pipelines.request import StylizeRequest
from stylevar.processing.images import ImageTooLargeError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_that_fit_get_their_pixels_at_once_and_give_them_back():
    async def scenario() -> None:
        budget = MemoryBudget(100)
        a, b = await budget.reserve(60, time.monotonic() + 10), await budget.reserve(40, time.monotonic() + 10)
        assert budget.held == 100
        a.release()
        a.release()  # idempotent
        assert budget.held == 40
        b.release()
        assert budget.held == 0

    asyncio.run(scenario())


def test_more_than_the_whole_budget_is_refused_as_too_large():
    with pytest.raises(ImageTooLargeError, match="STYLEVAR_MAX_PIXELS_IN_FLIGHT"):
        asyncio.run(MemoryBudget(100).reserve(101, time.monotonic() + 10))


def test_no_bound_at_zero():
    async def scenario() -> None:
        budget = MemoryBudget(0)
        held = [await budget.reserve(10**9, time.monotonic() + 1) for _ in range(3)]
        assert budget.held == 0 and len(held) == 3

    asyncio.run(scenario())


def test_the_line_is_first_come_first_served_and_passed_only_where_no_waiter_is_delayed():
    """A small request behind a large one waits too when its pixels would delay the large one (no starvation of the
    large one); one small enough to leave the large one its room passes it; the large one gets its pixels as soon as
    the holder gives them back, the one that passed still holding."""
    async def scenario() -> list[str]:
        budget, order = MemoryBudget(100), []
        holder = await budget.reserve(60, time.monotonic() + 10)

        async def ask(name: str, pixels: int, hold_s: float) -> None:
            r = await budget.reserve(pixels, time.monotonic() + 10)
            order.append(name)
            await asyncio.sleep(hold_s)
            r.release()

        tasks = [asyncio.create_task(ask("large", 95, 0.05))]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(ask("small", 10, 0.05)))  # fits beside the holder, but 10 + 95 > 100
        tasks.append(asyncio.create_task(ask("tiny", 5, 0.5)))  # 5 + 95 <= 100: it cannot delay the large one
        await asyncio.sleep(0.1)
        assert order == ["tiny"] and budget.waiting == 105 and budget.passing == 5
        holder.release()  # the large one fits beside the tiny one, which still holds its 5
        await asyncio.sleep(0.01)
        assert order == ["tiny", "large"]
        await asyncio.gather(*tasks)
        assert budget.held == 0 and budget.waiting == 0 and budget.passing == 0
        return order

    assert asyncio.run(scenario()) == ["tiny", "large", "small"]


def test_a_waiter_behind_the_head_passes_once_the_room_it_needs_is_free():
    async def scenario() -> None:
        budget = MemoryBudget(100)
        holder = await budget.reserve(50, time.monotonic() + 10)
        passer = await budget.reserve(40, time.monotonic() + 10)  # an empty line: no passing
        head = asyncio.create_task(budget.reserve(60, time.monotonic() + 10))
        await asyncio.sleep(0.01)
        small = asyncio.create_task(budget.reserve(10, time.monotonic() + 10))  # 90 + 10 fits, but 10 + 60 ...
        await asyncio.sleep(0.01)
        assert small.done() and budget.passing == 10  # ... leaves the head its 60 once the others are back
        third = asyncio.create_task(budget.reserve(35, time.monotonic() + 10))  # 10 + 35 + 60 > 100: waits
        await asyncio.sleep(0.01)
        assert not third.done() and not head.done()
        (await small).release()  # 90 held: the third's 35 does not fit yet
        await asyncio.sleep(0.01)
        assert not third.done()
        passer.release()  # 50 held: the head's 60 does not fit; the third's 35 does and leaves the head its 60
        await asyncio.sleep(0.01)
        assert third.done() and not head.done() and budget.passing == 35
        holder.release()
        r = await asyncio.wait_for(head, 1)
        assert budget.held == 95
        r.release()
        (await third).release()
        assert budget.held == 0 and budget.passing == 0

    asyncio.run(scenario())


def test_a_wait_ends_with_503_before_the_deadline_and_leaves_the_line():
    async def scenario() -> None:
        budget = MemoryBudget(100)
        holder = await budget.reserve(100, time.monotonic() + 10)
        t0 = time.monotonic()
        with pytest.raises(MemoryBusyError) as refused:
            await budget.reserve(50, t0 + MARGIN_S + 0.3)
        waited = time.monotonic() - t0
        assert 0.2 < waited < 0.3 + 0.2, "it stops waiting MARGIN_S before its deadline"
        assert refused.value.retry_after_s >= 1 and refused.value.code == "memory_busy"
        assert budget.waiting == 0
        holder.release()
        assert budget.held == 0

    asyncio.run(scenario())


def test_a_line_that_would_outlast_the_deadline_is_refused_at_once():
    """Once a hold time has been measured, a request the line ahead would hold past its deadline is refused
    without waiting, with a Retry-After of the predicted wait; `check` says the same before a body is read."""
    async def scenario() -> None:
        clock = Clock()
        budget = MemoryBudget(100, clock=clock)
        await measure(budget, clock, 100, 10.0, times=3)  # 100 pixels held for 10 s, three times: sure
        held = await budget.reserve(100, clock.now + 60)  # predicted to leave 10 s from now
        waiting = asyncio.create_task(budget.reserve(100, clock.now + 60))  # then 10 s more
        await asyncio.sleep(0.01)
        with pytest.raises(MemoryBusyError) as refused:
            await budget.reserve(50, clock.now + 20)  # would start at +20 s, its deadline
        assert refused.value.retry_after_s == 20
        budget.check(21.0)  # the smallest request cannot pass (nothing is free): it would start after the one
        with pytest.raises(MemoryBusyError):  # waiting, at +20 s
            budget.check(20.0)
        held.release()
        (await waiting).release()
        budget.check(1.0)  # the line is empty

    asyncio.run(scenario())


def test_pixels_granted_too_late_go_back_and_the_request_is_refused():
    """The last moment to start follows the measured hold: a waiter whose turn comes when too little time is left
    to be answered gives the pixels back at once (503), and the next in line gets them."""
    async def scenario() -> None:
        clock = Clock()
        budget = MemoryBudget(100, clock=clock)
        await measure(budget, clock, 100, 5.0, times=2)
        holder = await budget.reserve(100, clock.now + 60)
        holder.reached_model = True
        late = asyncio.create_task(budget.reserve(100, clock.now + 8))
        after = asyncio.create_task(budget.reserve(100, clock.now + 60))
        await asyncio.sleep(0.01)
        clock.now += 5.0
        answered(holder)  # measured a third time: 5 s for 100 pixels; `late` has 3 s left: too little
        with pytest.raises(MemoryBusyError):
            await late
        assert budget.hold_s(100) == pytest.approx(5.0), "pixels given back unused are no measurement of a hold"
        (await asyncio.wait_for(after, 2)).release()
        assert budget.held == 0 and budget.waiting == 0

    asyncio.run(scenario())


def answered(r: Reservation) -> None:
    """`r`'s answer handed over whole now, then sent: its hold is measured."""
    r.answer_handed_over()
    r.release()


async def measure(budget: MemoryBudget, clock: Clock, pixels: int, seconds: float, times: int = 1) -> None:
    """`times` requests of `pixels` that reached the model, each holding them for `seconds`."""
    for _ in range(times):
        r = await budget.reserve(pixels, clock.now + 600)
        r.reached_model = True
        clock.now += seconds
        answered(r)


def test_holds_are_a_fixed_cost_plus_a_cost_per_pixel_learned_from_requests_that_reached_the_model():
    async def scenario() -> None:
        clock = Clock()
        budget = MemoryBudget(10_000, clock=clock)
        refused = await budget.reserve(9_000, clock.now + 60)
        clock.now += 0.01
        refused.release()  # a request refused after its reservation (a bad upload): no model work, not measured
        assert budget.holds.predict(100) is None and budget.holds.largest == 0
        await measure(budget, clock, 100, 1.1)
        await measure(budget, clock, 1000, 2.0)
        assert budget.holds.predict(100) is None, "two holds: unsure"
        await measure(budget, clock, 100, 1.1)
        assert budget.hold_s(550) == pytest.approx(1.55)  # 1 s fixed, 1 ms a pixel
        assert budget.hold_s(100) == pytest.approx(1.1) and budget.hold_s(50) == pytest.approx(1.05)
        assert budget.holds.predict(1001) is None, "larger than any measured: unsure"
        slow_reader = await budget.reserve(1000, clock.now + 60)
        slow_reader.reached_model = True
        clock.now += 2.0
        slow_reader.answer_handed_over()  # its answer was ready after 2 s; the client then read it for 50 s
        clock.now += 50.0
        slow_reader.release()
        assert budget.hold_s(1000) < 2.1, "a slow reader's reading is no part of the measured hold"
        cut = await budget.reserve(1000, clock.now + 60)
        cut.reached_model = True
        clock.now += 60.0
        cut.release()  # a stream or result its client never read, cut by the send timeout: never handed over
        assert budget.hold_s(1000) < 2.1 and budget.holds.measured == 4, "an answer never handed over whole: unmeasured"

    asyncio.run(scenario())


def test_a_burst_larger_than_anything_measured_waits_instead_of_being_refused():
    """Issue 55, finding 5 in small: tiny requests first (one refused), then a burst of requests that fit one at a
    time, each far larger than the tiny ones: the tiny requests' fixed overhead is no measure of theirs, so none
    is refused at once; each waits its turn and is served within its deadline."""
    async def scenario() -> list[str]:
        clock = Clock()
        budget = MemoryBudget(1_000_000, clock=clock)
        await measure(budget, clock, 100, 0.5, times=3)  # sure about tiny requests only
        refused = await budget.reserve(100, clock.now + 60)
        refused.release()
        deadline = clock.now + 60
        first = await budget.reserve(600_000, deadline)
        first.reached_model = True
        waiting = [asyncio.create_task(budget.reserve(600_000, deadline)) for _ in range(7)]
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in waiting), "none refused at once"
        holder, served = first, []
        for task in waiting:
            clock.now += 2.0  # each holds its pixels for 2 s: seven in a row fit within the deadline
            answered(holder)
            holder = await asyncio.wait_for(task, 5)
            holder.reached_model = True
            served.append("ok")
        holder.release()
        return served

    assert asyncio.run(scenario()) == ["ok"] * 7


def test_a_stream_of_small_requests_does_not_wash_out_what_large_ones_hold():
    """The soak's later bursts (issue 55): after a round of large requests, hundreds of small ones (each held up
    behind a large one's model work for a while) must not teach the budget that a large request holds for minutes:
    each size class keeps its own measured hold, so the next burst is admitted to wait, not refused at once."""
    async def scenario() -> None:
        clock = Clock()
        budget = MemoryBudget(1_000_000, clock=clock)
        await measure(budget, clock, 600_000, 4.0, times=8)
        for i in range(300):
            await measure(budget, clock, 100, 3.0 if i % 3 else 0.3)
        assert budget.hold_s(600_000) == pytest.approx(4.0)
        assert budget.hold_s(300_000) == pytest.approx((budget.hold_s(100) + 4.0) / 2, rel=1e-3)  # on their line
        deadline = clock.now + 60
        first = await budget.reserve(600_000, deadline)
        waiting = [asyncio.create_task(budget.reserve(600_000, deadline)) for _ in range(7)]
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in waiting), "7 x 4 s fit within 60 s: none refused"
        first.release()
        for task in waiting:
            (await asyncio.wait_for(task, 1)).release()

    asyncio.run(scenario())


def test_a_client_that_leaves_while_waiting_leaves_the_line():
    async def scenario() -> None:
        budget = MemoryBudget(100)
        holder = await budget.reserve(100, time.monotonic() + 10)

        async def gone() -> bool:
            return True

        with pytest.raises(ClientGone):
            await budget.reserve(10, time.monotonic() + 10, gone)
        cancelled = asyncio.create_task(budget.reserve(10, time.monotonic() + 10))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert budget.waiting == 0
        holder.release()
        assert budget.held == 0

    asyncio.run(scenario())


# ---- the pixels a request counts ------------------------------------------------------------------
def png(w: int, h: int, rgb: tuple[int, int, int] = (200, 120, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), rgb).save(buf, "PNG")
    return buf.getvalue()


class Upload:
    def __init__(self, data: bytes):
        self.file = io.BytesIO(data)


def test_a_request_counts_its_decoded_images_masks_and_results():
    plan = [("content", Upload(png(600, 400)), 300), ("style", Upload(png(500, 500)), 100),
            ("style_mask", Upload(png(50, 20)), 100)]
    content, style, mask, result = 300 * 200, 100 * 100, 50 * 20, 150 * 100  # the mask is smaller than its side
    assert stylize.request_pixels(plan, StylizeRequest(num_samples=2), 150) == \
        content + style + mask + content + 2 * result  # the mask once more at the content's size
    assert stylize.request_pixels(plan, StylizeRequest(resize="crop"), 150) == \
        content + style + mask + content + 150 * 150
    assert plan[0][1].file.tell() == 0, "the header read leaves the file at its start"
    assert stylize.request_pixels([("content", Upload(b"not an image"), 300)], StylizeRequest(), 150) == 0


# ---- through the app ------------------------------------------------------------------------------
CONTENT, STYLE = png(120, 80), png(40, 40, (20, 60, 200))
COST = 120 * 80 * 2 + 40 * 40  # content decoded, its result, the style


def serve(model_dir, **settings) -> TestClient:
    base = dict(model_dir=model_dir, device=["cpu"], ui=False, warmup=False, max_output_side=256)
    return TestClient(create_app(ServeSettings(**{**base, **settings})))


def post(client: TestClient, seed: int, content: bytes = CONTENT):
    return client.post("/stylize", files={"content": ("c.png", content, "image/png"),
                                          "style": ("s.png", STYLE, "image/png")}, data={"seed": str(seed)})


def post_all(client: TestClient, n: int, content: bytes = CONTENT) -> list:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda seed: post(client, seed, content), range(n)))


@pytest.fixture
def slow_encoding(monkeypatch):
    """Each answer's encoding takes 0.4 s (a full-size PNG's, in small) and records the pixels held meanwhile."""
    seen: list[tuple[int, int]] = []  # (pixels held, encodings running) while encoding
    running = [0]
    real = stylize.encode

    def encode(state, form, images):
        running[0] += 1
        seen.append((budget[0].held, running[0]))
        time.sleep(0.4)
        running[0] -= 1
        return real(state, form, images)

    budget: list[MemoryBudget] = []
    monkeypatch.setattr(stylize, "encode", encode)
    return budget, seen


def test_requests_beyond_the_budget_wait_their_turn(micro_model_dir, slow_encoding):
    budget, seen = slow_encoding
    with serve(micro_model_dir, max_pixels_in_flight=COST + COST // 2) as client:  # room for one at a time
        budget.append(client.app.state.service.memory)
        answers = post_all(client, 4)
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        assert all(held <= COST + COST // 2 and running == 1 for held, running in seen), seen
        assert budget[0].held == 0 and budget[0].waiting == 0
        metrics = client.get("/metrics").text
    assert "stylevar_pixels_in_flight 0.0" in metrics and "stylevar_pixels_waiting 0.0" in metrics


def test_requests_that_cannot_have_the_pixels_in_time_get_503_with_retry_after(micro_model_dir, monkeypatch):
    """The first request holds the whole budget until every other one is answered: the others can only be refused
    at their deadline (nothing is released before it), however fast or busy the machine is."""
    n, release, real = 6, threading.Event(), stylize.encode

    def encode(state, form, images):
        release.wait(30)  # a service that made them wait for the pixels answers them only after this
        return real(state, form, images)

    monkeypatch.setattr(stylize, "encode", encode)
    with serve(micro_model_dir, max_pixels_in_flight=COST, request_timeout_s=3.0) as client:  # ample for the first
        budget = client.app.state.service.memory
        with ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(post, client, seed) for seed in range(n)]
            answers = []
            for future in as_completed(futures):
                answers.append(future.result())
                if len(answers) == n - 1:
                    refused_while_held = budget.held == COST
                    release.set()
        assert [r.status_code for r in answers] == [503] * (n - 1) + [200], [r.text for r in answers]
        assert refused_while_held, "the refusals came while the first request still held its pixels"
        for r in answers[:-1]:
            assert r.json()["error"] == "memory_busy" and int(r.headers["retry-after"]) >= 1
        assert budget.held == 0 and budget.waiting == 0
        rejected = client.get("/metrics").text
    assert f'stylevar_jobs_rejected_total{{reason="memory_busy"}} {float(n - 1)}' in rejected


def test_a_request_larger_than_the_whole_budget_is_413_before_decoding(micro_model_dir, monkeypatch):
    with serve(micro_model_dir, max_pixels_in_flight=COST - 1) as client:
        state = client.app.state.service
        decoded = []
        monkeypatch.setattr(state.decoder, "decode", lambda *a, **kw: decoded.append(1))
        r, = post_all(client, 1)
        assert r.status_code == 413 and r.json()["error"] == "image_too_large", r.text
        assert "STYLEVAR_MAX_PIXELS_IN_FLIGHT" in r.json()["detail"] and decoded == []
        assert state.memory.held == 0


def test_the_pixels_come_back_when_a_request_fails_or_streams(micro_model_dir):
    with serve(micro_model_dir, max_pixels_in_flight=10 * COST) as client:
        memory = client.app.state.service.memory
        r = client.post("/stylize", files={"content": ("c.png", CONTENT[:60], "image/png"),
                                           "style": ("s.png", STYLE, "image/png")})
        assert r.status_code == 422 and memory.held == 0  # decoding failed after the reservation
        assert memory.holds.largest == 0, "a request that never reached the model teaches no hold time"
        with client.stream("POST", "/stylize/stream", files={"content": ("c.png", CONTENT, "image/png"),
                                                             "style": ("s.png", STYLE, "image/png")}) as s:
            lines = [line for line in s.iter_lines() if line]
        assert "event: result" in lines and memory.held == 0
        assert memory.holds.largest == COST, "the stream's model work succeeded: its hold is measured"


def test_large_requests_hand_the_freed_heap_back(micro_model_dir, monkeypatch):
    from serve.http import memory

    asked = []
    monkeypatch.setattr(memory, "HEAP_TRIMMER", type("Trimmer", (), {"request": lambda self: asked.append(1)})())
    monkeypatch.setattr(memory, "TRIM_PIXELS", COST)  # in small: a request of COST pixels is a large one
    with serve(micro_model_dir) as client:
        assert post_all(client, 1)[0].status_code == 200 and asked == [1]
        small = png(60, 40)  # 60 x 40 x 2 + 1600 pixels: below
        assert post_all(client, 1, content=small)[0].status_code == 200 and asked == [1]


def test_the_trimmer_calls_malloc_trim_on_its_thread():
    from serve.http.memory import HeapTrimmer

    trimmer, called = HeapTrimmer(), threading.Event()
    trimmer._trim = lambda pad: called.set()
    trimmer.request()
    assert called.wait(5)
