"""Links between two Python processes over shared memory: what arrives,
in which forms buffers go in and come out, and what each failure raises."""

import _thread
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import barlink
from peer import payload


def accept(name: str, **options) -> barlink.Link:
    # Stalls of a loaded machine must not look like a lost peer; tests of
    # peer loss pass their own.
    options.setdefault("peer_timeout", 10.0)
    return barlink.connect(name, "accept", 10.0, **options)


@pytest.fixture
def echo(name, spawn):
    """A link to a process that sends every message back."""
    spawn("echo", name)
    link = accept(name)
    yield link
    link.close()


def test_the_path_says_which_and_why(echo):
    assert echo.path_kind == "host-bounce"
    assert echo.path.startswith("host-bounce: ")
    assert "host-bounce" in repr(echo)


@pytest.mark.parametrize(
    "make",
    [
        lambda data: data,  # bytes: read in place
        bytearray,  # writable: copied, or lent for the call from 512 KiB
        memoryview,
        lambda data: np.frombuffer(data, dtype=np.uint8).copy(),
        lambda data: np.frombuffer(data[: len(data) // 4 * 4], dtype=np.float32).copy(),
    ],
    ids=["bytes", "bytearray", "memoryview", "numpy-uint8", "numpy-float32"],
)
def test_every_buffer_kind_goes_and_comes_back_intact(echo, make):
    for size in [0, 1, 63, 4096, 65536, 1 << 20, (4 << 20) + 3]:
        data = os.urandom(size)
        buf = make(data)
        echo.send(buf, timeout=10)
        back = echo.recv(timeout=10)
        assert isinstance(back, bytes)
        assert back == bytes(memoryview(buf).cast("B")), size


def test_a_writable_buffer_may_change_once_send_returns(echo):
    buf = bytearray(b"a" * 100_000)
    echo.send(buf)
    buf[:] = b"b" * 100_000
    assert echo.recv(timeout=10) == b"a" * 100_000


@pytest.mark.parametrize("delay", [0.0, 1.0], ids=["reading", "not-reading-yet"])
def test_long_writable_sends_leave_the_buffer_free_at_return(name, spawn, delay):
    # Long writable sends are read in place while the peer answers, and
    # copied when it does not: either way the buffer is the caller's when
    # send returns. Each is overwritten at once; the peer checks every
    # message. 8 MiB is twice the ring: the wait for a message that stops
    # moving (about as long as a copy) lasts a millisecond.
    count, size = 12, 8 << 20
    spawn("sink", name, count, size, delay)
    with accept(name) as link:
        buf = bytearray(size)
        started = time.monotonic()
        for i in range(count):
            buf[:] = payload(i, size)
            link.send(buf, timeout=30)
            # Let go of, too: a bytearray still exported cannot resize.
            buf.append(0)
            del buf[-1]
            buf[:] = b"\xee" * size
        sending = time.monotonic() - started
        assert link.recv(timeout=30) == b"ok"
        stats = link.stats()
        assert stats["messages_lent"] + stats["messages_copied"] == count, stats
        if delay:
            # The peer read nothing for a second: the sends copied and
            # returned rather than wait for it.
            assert stats["messages_copied"] > 0, stats
            assert sending < delay + 10, sending
        else:
            assert stats["messages_lent"] > 0, stats


def test_a_long_writable_send_that_times_out_leaves_a_copy_that_arrives(name, spawn):
    # 8 MiB, twice the peer's ring, to a peer that reads only when told:
    # the send times out with half the message still to go, the caller
    # reuses its buffer at once, and what goes later is the copy.
    size = 8 << 20
    peer = spawn("sink", name, 1, size, "stdin", stdin=subprocess.PIPE)
    with accept(name) as link:
        buf = bytearray(payload(0, size))
        with pytest.raises(TimeoutError):
            link.send(buf, timeout=0.3)
        buf.append(0)
        buf[:] = b"\xee" * (size + 1)
        peer.stdin.write("go\n")
        peer.stdin.flush()
        assert link.recv(timeout=30) == b"ok"
        assert link.stats()["messages_copied"] == 1


def test_a_close_during_a_long_writable_send_ends_it_and_frees_the_buffer(name, spawn):
    # 8 MiB lent to a peer that never reads; another thread closes the
    # link meanwhile. The send ends (the link is closed), and the buffer
    # is the caller's again.
    size = 8 << 20
    spawn("sink", name, 1, size, "stdin", stdin=subprocess.PIPE)
    link = accept(name)
    buf = bytearray(payload(0, size))
    ended = []

    def send():
        try:
            link.send(buf, timeout=20)
            ended.append("returned")
        except (barlink.LinkClosed, barlink.LinkFailed) as error:
            ended.append(type(error).__name__)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.2)
    try:
        link.close(timeout=0.5)
    except (TimeoutError, barlink.LinkFailed):
        pass  # the peer never read: the orderly close could not finish
    sender.join(timeout=10)
    assert not sender.is_alive() and ended, ended
    buf.append(0)  # a bytearray still exported cannot resize


def test_a_long_writable_send_that_fails_lets_go_of_the_buffer(name, spawn):
    spawn("echo", name)
    with accept(name, max_message_bytes=1 << 20) as link:
        buf = bytearray((1 << 20) + 1)
        with pytest.raises(ValueError, match="exceeds"):
            link.send(buf)
        buf.append(0)  # a bytearray still exported cannot resize
        buf = bytearray(1 << 20)
        with pytest.raises(ValueError, match="timeout"):
            link.send(buf, timeout=-1)
        buf.append(0)
        link.send(b"still works")
        assert link.recv(timeout=10) == b"still works"


def test_messages_arrive_in_order_and_once(echo):
    for i in range(2000):
        echo.send(payload(i, 8 + i % 300))
    for i in range(2000):
        assert echo.recv(timeout=10) == payload(i, 8 + i % 300)
    with pytest.raises(TimeoutError):
        echo.recv(timeout=0.05)


def test_a_sixteen_mebibyte_message_is_intact(echo):
    data = os.urandom(16 << 20)
    echo.send(data)
    back = echo.recv(timeout=30, copy=False)
    assert len(back) == len(data)
    assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()


def test_a_sender_that_turns_away_after_send_left_nothing_behind(name, spawn):
    # More than the ring holds: send() must have pushed all of it out.
    spawn("turn", name, 16 << 20)
    with accept(name, peer_timeout=60.0) as link:
        assert link.recv(timeout=10) == payload(7, 16 << 20)


@pytest.mark.parametrize("make", [bytes, bytearray], ids=["bytes", "lent-bytearray"])
def test_both_sides_may_send_more_than_the_window_before_receiving(name, spawn, make):
    # 24 MiB each way, more than the rings and windows hold: a send that
    # waited for credit the other side's caller holds would never return
    # (nor may a lent one wait for its acknowledgement).
    peer = spawn("swap", name, 24, 1 << 20)
    with accept(name) as link:
        for i in range(24):
            link.send(make(payload(1000 + i, 1 << 20)), timeout=30)
        for i in range(24):
            assert link.recv(timeout=30) == payload(i, 1 << 20)
        # Sends that returned while the peer's messages waited here may
        # still be on their way: flush before turning away.
        link.flush(timeout=30)
    assert peer.wait(timeout=30) == 0


def test_a_message_can_be_read_in_place(echo):
    echo.send(b"\x01\x02\x03\x04" * 1000)
    message = echo.recv(timeout=10, copy=False)
    assert isinstance(message, barlink.Message)
    assert len(message) == 4000
    view = memoryview(message)
    assert view.readonly
    assert bytes(view[:4]) == b"\x01\x02\x03\x04"
    assert np.frombuffer(message, dtype=np.uint32)[0] == 0x04030201
    assert bytes(message) == message.tobytes() == b"\x01\x02\x03\x04" * 1000
    with pytest.raises(TypeError, match="read-only"):
        view[0] = 0
    with pytest.raises(ValueError):
        np.frombuffer(message, dtype=np.uint8).setflags(write=True)
    del view


def test_recv_into_fills_the_callers_buffer(echo):
    data = os.urandom(300_000)
    echo.send(data)
    out = np.zeros(400_000, dtype=np.uint8)
    n = echo.recv_into(out, timeout=10)
    assert n == len(data)
    assert out[:n].tobytes() == data


def test_a_large_buffer_is_lent_to_the_link_and_the_message_lands_there(echo):
    # recv_into waits first, so its buffer is lent before the echo arrives.
    out = np.zeros(3 << 20, dtype=np.uint8)
    got = {}
    waiter = threading.Thread(target=lambda: got.update(n=echo.recv_into(out, timeout=10)))
    waiter.start()
    time.sleep(0.3)
    data = os.urandom(2 << 20)
    echo.send(data, timeout=10)
    waiter.join(timeout=20)
    assert got["n"] == len(data)
    assert out[: len(data)].tobytes() == data
    assert echo.stats()["messages_landed"] == 1
    # Too large for a lent buffer: it stays first in line, as for small ones.
    echo.send(b"y" * (300 << 10), timeout=10)
    small = bytearray(200 << 10)
    with pytest.raises(ValueError, match="307200 bytes"):
        echo.recv_into(small, timeout=10)
    big = bytearray(300 << 10)
    assert echo.recv_into(big, timeout=10) == 300 << 10
    assert big == b"y" * (300 << 10)


def test_a_lent_buffer_is_left_alone_once_recv_into_returned(echo):
    first = bytearray(1 << 20)
    with pytest.raises(TimeoutError):
        echo.recv_into(first, timeout=0.2)
    first[:] = b"\x5a" * len(first)
    data = os.urandom(1 << 20)
    echo.send(data, timeout=10)
    second = bytearray(1 << 20)
    assert echo.recv_into(second, timeout=10) == len(data)
    assert second == data
    assert first == b"\x5a" * len(first)


def test_a_message_too_large_for_the_buffer_stays_first_in_line(echo):
    echo.send(b"x" * 1000)
    echo.send(b"second")
    small = bytearray(10)
    with pytest.raises(ValueError, match="1000 bytes"):
        echo.recv_into(small, timeout=10)
    big = bytearray(1000)
    assert echo.recv_into(big, timeout=10) == 1000
    assert big == b"x" * 1000
    assert echo.recv(timeout=10) == b"second"


def test_posted_sends_complete_when_acknowledged(echo):
    data = [np.full(100_000, i, dtype=np.uint8) for i in range(20)]
    requests = [echo.post_send(d) for d in data]
    for request in requests:
        request.wait(timeout=10)
        assert request.test()
    for i in range(20):
        assert echo.recv(timeout=10) == bytes([i]) * 100_000


def test_stats_count_what_moved(echo):
    echo.send(b"x" * 10)
    echo.recv(timeout=10)
    stats = echo.stats()
    assert stats["messages_delivered"] == 1
    assert stats["crc_failures"] == 0
    assert set(stats) >= {"packets_sent", "retransmits_nak", "retransmits_timeout"}


def test_bad_buffers_are_type_errors(echo):
    with pytest.raises(TypeError, match="buffer protocol"):
        echo.send("a str is not bytes")
    with pytest.raises(TypeError, match="writable"):
        echo.recv_into(b"read-only", timeout=1)
    strided = np.zeros((8, 8), dtype=np.uint8)[:, ::2]
    with pytest.raises(TypeError, match="contiguous"):
        echo.send(strided)


def test_a_message_over_the_limit_is_a_value_error(name, spawn):
    spawn("echo", name)
    with accept(name, max_message_bytes=1 << 20) as link:
        with pytest.raises(ValueError, match="exceeds"):
            link.send(bytes((1 << 20) + 1))
        link.send(b"still works")
        assert link.recv(timeout=10) == b"still works"


@pytest.mark.parametrize(
    "args, match",
    [
        (dict(role="listen"), "role"),
        (dict(timeout=-1), "timeout"),
        (dict(peer_timeout=0), "peer_timeout"),
        (dict(mtu=10), "(?i)mtu"),
        (dict(path="pigeon"), "path"),
        (dict(psk_file="/nonexistent/psk", key_file="/k"), "one way"),
        (dict(key_file="/k"), "peer_keys"),
    ],
)
def test_bad_arguments_are_value_errors(name, args, match):
    role = args.pop("role", "connect")
    with pytest.raises(ValueError, match=match):
        barlink.connect(name, role, **args)


def test_an_empty_peer_is_a_value_error():
    with pytest.raises(ValueError, match="empty peer"):
        barlink.connect("")


def test_nobody_listening_is_a_setup_error_within_the_timeout(name):
    started = time.monotonic()
    with pytest.raises(barlink.SetupError) as error:
        barlink.connect(name, "connect", 0.5)
    assert time.monotonic() - started < 5
    assert isinstance(error.value, ConnectionError)


@pytest.mark.parametrize("waiting_for", ["a message", "an acknowledgement", "progress"])
def test_a_killed_peer_is_peer_lost_within_the_peer_timeout(name, spawn, waiting_for):
    import subprocess

    holder = spawn("hold", name, stdout=subprocess.PIPE)
    link = accept(name, peer_timeout=1.0)
    assert holder.stdout.readline().strip() == "linked"
    holder.kill()
    started = time.monotonic()
    with pytest.raises(barlink.PeerLost) as error:
        if waiting_for == "a message":
            link.recv(timeout=30)
        elif waiting_for == "progress":
            # A caller that only drives the link between computations.
            while time.monotonic() - started < 30:
                link.progress()
                time.sleep(0.001)
        else:
            # A posted send's wait learns it too, though no message is due.
            link.post_send(bytes(1 << 20)).wait(timeout=30)
    assert time.monotonic() - started < 3.0
    assert "peer" in str(error.value)
    assert isinstance(error.value, barlink.LinkFailed)
    assert isinstance(error.value, ConnectionError)


def test_a_peer_that_closes_delivers_everything_first(name, spawn):
    sender = spawn("send", name, 50, 10_000)
    link = accept(name)
    for i in range(50):
        assert link.recv(timeout=10) == payload(i, 10_000)
    with pytest.raises(barlink.LinkClosed):
        link.recv(timeout=10)
    # A send after it names who closed.
    with pytest.raises(barlink.LinkClosed, match="peer closed"):
        link.send(b"too late")
    assert sender.wait(timeout=10) == 0


def test_calls_after_close_raise_link_closed(echo):
    echo.close()
    assert echo.closed
    with pytest.raises(barlink.LinkClosed):
        echo.send(b"late")
    with pytest.raises(barlink.LinkClosed):
        echo.recv(timeout=0)
    with pytest.raises(barlink.LinkClosed):
        echo.stats()
    echo.close()  # again: nothing


def test_other_threads_run_while_recv_waits(echo):
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    with pytest.raises(TimeoutError):
        echo.recv(timeout=0.3)
    stop.set()
    counter.join()
    assert ticks > 50


def test_one_thread_sends_while_another_receives(echo):
    count = 500
    got = []

    def receive():
        for _ in range(count):
            got.append(echo.recv(timeout=10))

    receiver = threading.Thread(target=receive)
    receiver.start()
    for i in range(count):
        echo.send(payload(i, 5000))
    receiver.join(timeout=30)
    assert got == [payload(i, 5000) for i in range(count)]


def test_a_send_beside_a_waiting_receive_gets_its_turn_at_once(echo):
    # A receive waiting on the link holds its lock in short stretches and
    # lets a send queued for it go first, instead of keeping it for whole
    # slices (sends then took tens of milliseconds each).
    stop = threading.Event()
    received, failed = [], []

    def receive():
        while not stop.is_set():
            try:
                received.append(echo.recv(timeout=0.5))
            except TimeoutError:
                pass
            except Exception as error:  # reported below: the waits must be real
                failed.append(error)
                return

    receiver = threading.Thread(target=receive)
    receiver.start()
    took = []
    try:
        time.sleep(0.1)
        for i in range(100):
            started = time.perf_counter()
            echo.send(payload(i, 64))
            took.append(time.perf_counter() - started)
            time.sleep(0.002)
    finally:
        stop.set()
        receiver.join(timeout=10)
    assert not failed and len(received) > 0, (failed, len(received))
    took.sort()
    assert took[50] < 0.010 and took[90] < 0.025, (
        f"send beside a waiting receive: median {took[50] * 1e3:.1f} ms, "
        f"90th percentile {took[90] * 1e3:.1f} ms"
    )


def test_ctrl_c_interrupts_a_wait(echo):
    # A shell starts background jobs with SIGINT ignored, and then
    # interrupt_main does nothing: handle it as an interactive Python does.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, _thread.interrupt_main).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            echo.recv()
        assert time.monotonic() - started < 2
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_signal_handler_runs_during_a_wait(echo):
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: seen.append(1))
    try:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(TimeoutError):
            echo.recv(timeout=0.5)
        assert seen == [1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_chain_refuses_steps_it_cannot_run(echo):
    a, b, c = bytearray(4096), bytearray(4096), bytearray(4096)
    with pytest.raises(ValueError, match="step 1 must send the buffer step 0 received"):
        barlink.Exchange.chain(echo, echo, [(a, b, False), (c, a, False)])
    with pytest.raises(ValueError, match="overlap"):
        barlink.Exchange.chain(echo, echo, [(a, memoryview(a)[100:200], False)])
    with pytest.raises(ValueError, match="no reduce was given"):
        barlink.Exchange.chain(echo, echo, [(a, b, True)])


def _chain_steps(size: int):
    """Four steps whose bytes come back as sent: copy A to B, B to C,
    combine C into D, and receive into A, which step 0 sent."""
    a = np.frombuffer(os.urandom(size), np.uint8).copy()
    b, c = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
    d = np.full(size, 3, np.uint8)
    steps = [(a, b, False), (b, c, False), (c, d, True), (d, a, False)]
    # D ends as 3 + A; so does A, which the last step fills with D.
    want = a.copy(), (a + np.uint8(3)).astype(np.uint8)
    return steps, (a, b, c, d), want


@pytest.mark.parametrize("chunk", [4096, 65536 + 64])
def test_a_chain_of_copying_and_combining_steps_against_an_echo_is_intact(echo, chunk):
    # The echo sends every message back, so each step receives what it
    # sent; many chunks a step, so steps may overlap and lend ahead. The
    # bytes are checked, not when each chunk went (steps run one after
    # another would pass too).
    steps, (a, b, c, d), (original, combined) = _chain_steps((1 << 20) + 4000)
    exchange = barlink.Exchange.chain(
        echo, echo, steps, chunk=chunk, reduce=("sum", "uint8"), tag=b"chain"
    )
    exchange.wait(timeout=60)
    assert exchange.done
    assert np.array_equal(b, original) and np.array_equal(c, original)
    assert np.array_equal(d, combined) and np.array_equal(a, combined)
    assert echo.stats()["crc_failures"] == 0


@pytest.mark.parametrize("chunk", [4096, 65536 + 64])
def test_a_chain_fills_its_first_buffer_as_it_sends(echo, chunk):
    # The first step's bytes come from `fill`, a chunk at a time: the
    # buffer ends holding them, and the echo sends back what went.
    size = (1 << 20) + 4000
    own = np.frombuffer(os.urandom(size), np.uint8).copy()
    a, b = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
    barlink.Exchange.chain(echo, echo, [(a, b, False)], chunk=chunk, tag=b"fill", fill=own).wait(
        timeout=60
    )
    assert np.array_equal(a, own) and np.array_equal(b, own)


@pytest.mark.parametrize("chunk", [4096, 65536 + 64])
@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_a_chain_step_combines_starting_from_a_buffer_it_names(echo, chunk, dtype):
    # The second step's values start from `base`, not from its recv_buf
    # (filled with junk, which must not show): recv_buf = base + received,
    # each chunk copied from base as it is combined; base is only read.
    size = (1 << 20) + 4000
    a = np.frombuffer(os.urandom(size), np.uint8).copy()
    base = np.frombuffer(os.urandom(size), np.uint8).copy()
    kept = base.copy()
    b, d = np.zeros(size, np.uint8), np.full(size, 0xEE, np.uint8)
    steps = [(a, b, False), (b, d, base)]
    barlink.Exchange.chain(echo, echo, steps, chunk=chunk, reduce=("sum", dtype)).wait(timeout=60)
    want = (base.view(dtype) + a.view(dtype)).view(np.uint8)
    assert np.array_equal(b, a) and np.array_equal(d, want)
    assert np.array_equal(base, kept)
    if chunk == 4096:
        # Most chunks are lent once the link has delivered a message, as
        # targets the link combines into as they arrive (larger chunks are
        # all lent before, as scratch, which `land` combines).
        assert echo.stats()["messages_combined"] > 0


def test_a_chain_refuses_a_base_it_cannot_combine_from(echo):
    a, b, c = bytearray(4096), bytearray(4096), bytearray(8192)
    with pytest.raises(ValueError, match="combines into 4096 bytes starting from 100"):
        barlink.Exchange.chain(echo, echo, [(a, b, bytes(100))], reduce=("sum", "uint8"))
    with pytest.raises(ValueError, match="no reduce was given"):
        barlink.Exchange.chain(echo, echo, [(a, b, bytes(4096))])
    with pytest.raises(ValueError, match="starting values overlap a step's recv_buf"):
        barlink.Exchange.chain(echo, echo, [(a, b, memoryview(b))], reduce=("sum", "uint8"))
    with pytest.raises(ValueError, match="starting values overlap a step's recv_buf"):
        barlink.Exchange.chain(echo, echo, [(a, memoryview(c)[:4096], memoryview(c)[4096:]),
                                            (memoryview(c)[:4096], memoryview(c)[4096:], False)],
                               reduce=("sum", "uint8"))
    with pytest.raises(ValueError, match="or the send_buf that fill writes"):
        barlink.Exchange.chain(echo, echo, [(a, b, memoryview(a))], reduce=("sum", "uint8"),
                               fill=bytes(4096))
    with pytest.raises(TypeError, match="third item must be True, False, or a buffer"):
        barlink.Exchange.chain(echo, echo, [(a, b, 1)], reduce=("sum", "uint8"))


def test_a_chain_refuses_a_fill_it_cannot_copy(echo):
    a, b, c = bytearray(4096), bytearray(4096), bytearray(8192)
    with pytest.raises(ValueError, match="fill has 100 bytes"):
        barlink.Exchange.chain(echo, echo, [(a, b, False)], fill=bytes(100))
    with pytest.raises(ValueError, match="fill overlaps"):
        barlink.Exchange.chain(echo, echo, [(a, b, False)], fill=memoryview(b))
    with pytest.raises(ValueError, match="fill overlaps"):
        barlink.Exchange.chain(echo, echo, [(memoryview(c)[:4096], b, False)],
                               fill=memoryview(c)[2048:6144])
    with pytest.raises(ValueError, match="no step may receive into the first step's send_buf"):
        barlink.Exchange.chain(echo, echo, [(a, b, False), (b, a, False)], fill=bytes(4096))


def _prints_ok_beside_an_echo(script: str, name: str, spawn, timeout: float):
    """Runs `script` in a Python process of its own, linked by `name` to an
    echo: a hang there fails the test (at `timeout`) instead of the suite."""
    spawn("echo", name)
    run = subprocess.run(
        [sys.executable, "-c", script, name], capture_output=True, text=True, timeout=timeout,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


# Waits on chains while another thread polls them; prints "ok".
_POLLED_WHILE_RUNNING = """
import sys, threading
import numpy as np
import barlink
link = barlink.connect(sys.argv[1], "accept", 10.0, peer_timeout=10.0)
current, stop = [None], threading.Event()
def poll():
    while not stop.is_set():
        if current[0] is not None:
            current[0].done
            current[0].test()
poller = threading.Thread(target=poll, daemon=True)
poller.start()
for _ in range(30):
    a = np.frombuffer(np.random.bytes(300_000), np.uint8).copy()
    b, c, d = (np.zeros(300_000, np.uint8) for _ in range(3))
    steps = [(a, b, False), (b, c, False), (c, d, False), (d, a, False)]
    current[0] = barlink.Exchange.chain(link, link, steps, chunk=8192)
    current[0].wait(timeout=30)
stop.set()
poller.join(timeout=30)
print("ok" if not poller.is_alive() else "the poller did not stop")
"""


def test_an_exchange_polled_from_another_thread_while_it_runs_finishes(name, spawn):
    # The waiting thread drives the chain without the GIL and takes the
    # GIL to release each finished step's buffers, while the polling
    # thread asks for the exchange's lock holding the GIL: a poll that
    # waited for the lock with the GIL hung both (in its own process, so
    # that a hang fails the test instead of stopping the suite).
    _prints_ok_beside_an_echo(_POLLED_WHILE_RUNNING, name, spawn, timeout=90)


# A daemon thread inside barlink's calls when the program exits: one
# receiving in a loop, each call returning after 1 ms, or one running
# exchanges back to back (its drive holds the exchange's lock). Each
# script prints "ok" and exits.
_DAEMON_AT_EXIT = """
import sys, threading, time
import numpy as np
import barlink
link = barlink.connect(sys.argv[1], "accept", 10.0, peer_timeout=10.0)
def receive():
    while True:
        try:
            link.recv(timeout=0.001)
        except TimeoutError:
            pass
def exchange():
    a, b = np.ones(300_000, np.uint8), np.zeros(300_000, np.uint8)
    while True:
        barlink.Exchange.chain(link, link, [(a, b, False)], chunk=8192).wait(timeout=30)
threading.Thread(target={target}, daemon=True).start()
time.sleep(0.3)
print("ok")
"""


@pytest.mark.parametrize("target", ["receive", "exchange"])
def test_a_daemon_thread_inside_a_call_at_exit_lets_the_process_exit(name, spawn, target):
    # CPython (before 3.14) unwinds a thread that takes the GIL back while
    # the interpreter finalizes; through a call's Rust frames that aborted
    # the process ("exception not rethrown", status 134) in every run. A
    # call that returns then parks its thread instead.
    for run in range(3):
        _prints_ok_beside_an_echo(_DAEMON_AT_EXIT.format(target=target), f"{name}-{run}",
                                  spawn, timeout=60)


_FINALIZER_ASKS_WHILE_RELEASED = """
import sys, weakref
import numpy as np
import barlink
link = barlink.connect(sys.argv[1], "accept", 10.0, peer_timeout=10.0)
for _ in range(5):
    a = np.frombuffer(np.random.bytes(300_000), np.uint8).copy()
    b = np.zeros(300_000, np.uint8)
    held, asked = [], []
    # Each runs when the exchange lets go of the last reference to its
    # buffer: the sent one, and the one received into.
    weakref.finalize(a, lambda: asked.append(held[0].done))
    weakref.finalize(b, lambda: asked.append(held[0].done))
    held.append(barlink.Exchange(link, a, link, b, chunk=8192))
    del a, b
    held[0].wait(timeout=30)
    assert len(asked) == 2, f"the exchange kept {2 - len(asked)} buffer(s) after wait"
    assert held[0].done
print("ok")
"""


def test_a_finalizer_that_asks_the_exchange_releasing_its_buffer_gets_an_answer(name, spawn):
    # Releasing a finished exchange's buffers can run Python code on the
    # thread driving it (here finalizers of the sent and the received
    # arrays, whose last references the exchange held): code that asks
    # that exchange whether it is done waited for the lock its own thread
    # held, for ever. In its own process, so that a hang fails the test
    # instead of the suite.
    _prints_ok_beside_an_echo(_FINALIZER_ASKS_WHILE_RELEASED, name, spawn, timeout=60)


def test_a_chain_out_over_one_link_and_back_over_another_is_intact(
    name, spawn
):
    # Out over one link, back over another through a relay: the last step
    # receives into A, which went out over the other link, so it waits for
    # that link's acknowledgement of A first.
    back = f"{name}-back"
    spawn("relay", name, back)
    out = accept(name)
    into = accept(back)
    try:
        steps, (a, b, c, d), (original, combined) = _chain_steps(300_000)
        barlink.Exchange.chain(
            out, into, steps, chunk=8192, reduce=("sum", "uint8"), tag=b"ring"
        ).wait(timeout=60)
        assert np.array_equal(b, original) and np.array_equal(c, original)
        assert np.array_equal(d, combined) and np.array_equal(a, combined)
    finally:
        out.close()
        into.close()


def test_a_combining_receive_folds_each_chunk_once_wherever_it_arrived(echo):
    # Once the link knows the ids of the messages to come, a combining
    # receive lends its own ranges, each naming its chunk's message, and
    # folds each chunk in as its packets arrive. Chunks that arrived before
    # the receive began are folded from the link's buffers instead. A sum
    # shows a chunk folded twice or missed.
    echo.send(b"ids")
    assert echo.recv(timeout=10) == b"ids"
    chunk, count, early = 65536, 8, 3
    parts = [np.arange(i * chunk // 4, (i + 1) * chunk // 4, dtype=np.int32) for i in range(count)]
    before = echo.stats()
    for part in parts[:early]:
        echo.send(part.tobytes())
    deadline = time.monotonic() + 10
    while echo.stats()["payload_bytes_received"] - before["payload_bytes_received"] < early * chunk:
        assert time.monotonic() < deadline, "the echo did not answer"
        echo.progress()
    buf = np.ones(count * chunk // 4, np.int32)
    exchange = barlink.Exchange(recv_from=echo, recv_buf=buf, chunk=chunk, reduce=("sum", "int32"))
    exchange.test()
    for part in parts[early:]:
        echo.send(part.tobytes())
    exchange.wait(timeout=30)
    assert np.array_equal(buf, 1 + np.concatenate(parts))
    after = echo.stats()
    assert after["messages_combined"] - before["messages_combined"] == count - early
    assert after["messages_delivered"] - before["messages_delivered"] == count


def test_a_combining_receive_that_timed_out_between_chunks_goes_on_when_waited_again(echo):
    # A timeout takes back the ranges lent for chunks still to come,
    # untouched; waited on again, the receive names them anew and every
    # chunk is combined once.
    echo.send(b"ids")
    assert echo.recv(timeout=10) == b"ids"
    chunk, count = 65536, 4
    parts = [np.full(chunk // 4, 10 + i, np.int32) for i in range(count)]
    buf = np.ones(count * chunk // 4, np.int32)
    exchange = barlink.Exchange(recv_from=echo, recv_buf=buf, chunk=chunk, reduce=("sum", "int32"))
    exchange.test()
    for part in parts[:2]:
        echo.send(part.tobytes())
    with pytest.raises(TimeoutError):
        exchange.wait(timeout=0.5)
    assert np.array_equal(buf[: 2 * chunk // 4], 1 + np.concatenate(parts[:2]))
    for part in parts[2:]:
        echo.send(part.tobytes())
    exchange.wait(timeout=30)
    assert np.array_equal(buf, 1 + np.concatenate(parts))


def test_a_combining_receive_takes_first_the_message_recv_into_left_in_line(echo):
    # A message too long for `recv_into` waits first in line outside the
    # link, which does not count it: the receive must not name the
    # messages after it as if it were not there.
    echo.send(b"ids")
    assert echo.recv(timeout=10) == b"ids"
    chunk = 65536
    parts = [np.full(chunk // 4, 5 + i, np.int32) for i in range(2)]
    echo.send(parts[0].tobytes())
    with pytest.raises(ValueError, match="stays first in line"):
        echo.recv_into(bytearray(16), timeout=10)
    buf = np.ones(2 * chunk // 4, np.int32)
    exchange = barlink.Exchange(recv_from=echo, recv_buf=buf, chunk=chunk, reduce=("sum", "int32"))
    exchange.test()
    echo.send(parts[1].tobytes())
    exchange.wait(timeout=30)
    assert np.array_equal(buf, 1 + np.concatenate(parts))


def test_an_exchange_refuses_a_reduction_its_dtype_has_not(echo):
    with pytest.raises(ValueError, match="not defined for F32"):
        barlink.Exchange(recv_from=echo, recv_buf=bytearray(64), reduce=("bxor", "float32"))


def test_a_chain_whose_peer_sent_another_tag_raises_mismatch(echo):
    a, b = bytearray(100), bytearray(100)
    echo.send(b"not the tag")
    exchange = barlink.Exchange.chain(echo, echo, [(a, b, False)], tag=b"ring")
    with pytest.raises(barlink.Mismatch, match="not the tag"):
        exchange.wait(timeout=30)
    # Kept: every later call raises it again, and it is not done.
    for call in (lambda: exchange.wait(timeout=1), exchange.test):
        with pytest.raises(barlink.Mismatch, match="not the tag"):
            call()
    assert not exchange.done


def test_an_exchange_that_timed_out_leaves_no_target_lent(echo):
    # Nothing comes, so the wait times out with the buffer's chunks lent;
    # a message after it must not land in them.
    buf = bytearray(1 << 20)
    exchange = barlink.Exchange(recv_from=echo, recv_buf=buf, chunk=65536)
    with pytest.raises(TimeoutError):
        exchange.wait(timeout=0.2)
    echo.send(b"late" * 250)
    assert echo.recv(timeout=10) == b"late" * 250
    assert buf == bytearray(1 << 20)


_LOG_CHILD = """
import sys, threading, barlink
name = sys.argv[1]
other = threading.Thread(target=lambda: barlink.connect(name, "connect", 10.0).close())
other.start()
barlink.connect(name, "accept", 10.0).close()
other.join()
"""


@pytest.mark.parametrize("value, shown", [(None, False), ("warn", False), ("info", True)])
def test_the_log_goes_to_stderr_only_as_barlink_log_says(name, value, shown):
    env = {k: v for k, v in os.environ.items() if k != "BARLINK_LOG"}
    if value is not None:
        env["BARLINK_LOG"] = value
    done = subprocess.run(
        [sys.executable, "-c", _LOG_CHILD, name],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert ("memfd rings exchanged" in done.stderr) == shown, done.stderr
    if value is None:
        assert done.stderr == "", "unset, the package says nothing"
