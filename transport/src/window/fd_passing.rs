//! Handing a window's file descriptor to another process over a Unix
//! socket (`SCM_RIGHTS`), so that a memfd window — which has no name — can
//! be mapped by the peer.
//!
//! A message is one tag byte ([`FD_MESSAGE_TAG`]) with exactly one
//! descriptor attached. Both directions take a timeout and never wait
//! longer: a peer that died or never connects ends in
//! [`WindowError::Timeout`] or [`WindowError::PeerClosed`].
//!
//! The timeout is applied as the socket's `SO_SNDTIMEO`/`SO_RCVTIMEO` for
//! the duration of the call and the previous setting restored afterwards,
//! so don't use the same socket from another thread during the call. The
//! socket must be in blocking mode (the default): on a non-blocking socket
//! the timeout cannot apply and a call that would wait fails at once with
//! [`WindowError::Timeout`].

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

use super::WindowError;

/// The byte that carries a window descriptor; anything else is not a window
/// message.
pub const FD_MESSAGE_TAG: u8 = b'W';

/// The shortest timeout applied: the socket options cannot express zero
/// (it means "wait forever"), so a zero timeout becomes this.
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// Sends `fd` over `stream`, waiting at most `timeout` for socket buffer
/// space.
pub fn send_fd(
    stream: &UnixStream,
    fd: BorrowedFd<'_>,
    timeout: Duration,
) -> Result<(), WindowError> {
    const OPERATION: &str = "send a window descriptor";
    let timeout = timeout.max(MIN_TIMEOUT);
    let previous = stream
        .write_timeout()
        .map_err(|e| socket_error(OPERATION, &e))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| socket_error(OPERATION, &e))?;
    let result = send_tagged_fd(stream, fd, timeout, OPERATION);
    // Restoring can fail only if the socket is gone, which `result` reports.
    let _ = stream.set_write_timeout(previous);
    result
}

fn send_tagged_fd(
    stream: &UnixStream,
    fd: BorrowedFd<'_>,
    timeout: Duration,
    operation: &'static str,
) -> Result<(), WindowError> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        // The buffer is sized for exactly one descriptor by `cmsg_space!`.
        unreachable!("control buffer sized for one descriptor");
    }
    let tag = [FD_MESSAGE_TAG];
    let deadline = Instant::now() + timeout;
    loop {
        // NOSIGNAL: a closed peer is an error to return, not SIGPIPE.
        match sendmsg(
            stream,
            &[IoSlice::new(&tag)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(1) => return Ok(()),
            Ok(_) => {
                return Err(WindowError::PeerClosed { operation });
            }
            Err(Errno::INTR) if Instant::now() < deadline => continue,
            Err(Errno::AGAIN | Errno::INTR) => {
                return Err(WindowError::Timeout {
                    operation,
                    after: timeout,
                });
            }
            Err(Errno::PIPE | Errno::CONNRESET | Errno::NOTCONN) => {
                return Err(WindowError::PeerClosed { operation });
            }
            Err(e) => {
                return Err(WindowError::Socket {
                    operation,
                    errno: e.raw_os_error(),
                });
            }
        }
    }
}

/// Receives one window descriptor from `stream`, waiting at most `timeout`.
///
/// The descriptor arrives close-on-exec. Extra descriptors a misbehaving
/// peer attaches are closed, and a message without a descriptor, with a
/// wrong tag or with truncated control data is an error.
pub fn recv_fd(stream: &UnixStream, timeout: Duration) -> Result<OwnedFd, WindowError> {
    const OPERATION: &str = "receive a window descriptor";
    let timeout = timeout.max(MIN_TIMEOUT);
    let previous = stream
        .read_timeout()
        .map_err(|e| socket_error(OPERATION, &e))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| socket_error(OPERATION, &e))?;
    let result = recv_tagged_fd(stream, timeout, OPERATION);
    let _ = stream.set_read_timeout(previous);
    result
}

fn recv_tagged_fd(
    stream: &UnixStream,
    timeout: Duration,
    operation: &'static str,
) -> Result<OwnedFd, WindowError> {
    let deadline = Instant::now() + timeout;
    loop {
        match receive_tagged(stream, RecvFlags::empty(), operation) {
            Ok(fd) => return fd,
            Err(Errno::INTR) if Instant::now() < deadline => continue,
            Err(Errno::AGAIN | Errno::INTR) => {
                return Err(WindowError::Timeout {
                    operation,
                    after: timeout,
                });
            }
            Err(error) => return Err(receive_error(operation, error)),
        }
    }
}

/// Takes a window descriptor from `stream` if one has arrived, without
/// waiting: `Ok(None)` when nothing is there yet. For a listener that
/// serves many handshakes at once, so that a peer which never sends costs
/// the others nothing.
pub fn try_recv_fd(stream: &UnixStream) -> Result<Option<OwnedFd>, WindowError> {
    const OPERATION: &str = "receive a window descriptor";
    loop {
        match receive_tagged(stream, RecvFlags::DONTWAIT, OPERATION) {
            Ok(fd) => return fd.map(Some),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(None),
            Err(error) => return Err(receive_error(OPERATION, error)),
        }
    }
}

fn receive_error(operation: &'static str, error: Errno) -> WindowError {
    match error {
        Errno::CONNRESET | Errno::NOTCONN => WindowError::PeerClosed { operation },
        e => WindowError::Socket {
            operation,
            errno: e.raw_os_error(),
        },
    }
}

/// One `recvmsg` of a window message: the socket's errno, or the verdict
/// on what arrived.
fn receive_tagged(
    stream: &UnixStream,
    flags: RecvFlags,
    operation: &'static str,
) -> Result<Result<OwnedFd, WindowError>, Errno> {
    // Room for a few descriptors, so that a peer sending more than one
    // cannot make the kernel drop them silently (they are closed below).
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut tag = [0u8; 1];
    let received = recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut tag)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | flags,
    )?;
    // Take ownership of every descriptor that arrived before judging the
    // message, so none leaks whatever the verdict.
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 && fds.is_empty() {
        return Ok(Err(WindowError::PeerClosed { operation }));
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Ok(Err(WindowError::NoFdReceived {
            reason: "the control data was truncated (more descriptors than a window message has)",
        }));
    }
    if tag[0] != FD_MESSAGE_TAG {
        return Ok(Err(WindowError::NoFdReceived {
            reason: "the message's tag byte is not a window message's",
        }));
    }
    Ok(match fds.len() {
        0 => Err(WindowError::NoFdReceived {
            reason: "the message had no descriptor attached",
        }),
        1 => Ok(fds.pop().expect("one descriptor")),
        _ => Err(WindowError::NoFdReceived {
            reason: "the message had more than one descriptor attached",
        }),
    })
}

fn socket_error(operation: &'static str, error: &std::io::Error) -> WindowError {
    WindowError::Socket {
        operation,
        errno: error.raw_os_error().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_crosses_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        send_fd(&a, file.as_fd(), Duration::from_secs(5)).unwrap();
        let received = recv_fd(&b, Duration::from_secs(5)).unwrap();
        let stat = rustix::fs::fstat(&received).unwrap();
        assert_eq!(stat.st_ino, rustix::fs::fstat(&file).unwrap().st_ino);
    }

    #[test]
    fn nothing_sent_times_out_and_restores_the_timeout() {
        let (_a, b) = UnixStream::pair().unwrap();
        let started = Instant::now();
        let result = recv_fd(&b, Duration::from_millis(50));
        assert!(
            matches!(result, Err(WindowError::Timeout { .. })),
            "{result:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(b.read_timeout().unwrap(), None);
    }

    #[test]
    fn a_closed_peer_is_reported() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(matches!(
            recv_fd(&b, Duration::from_secs(5)),
            Err(WindowError::PeerClosed { .. })
        ));
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(matches!(
            send_fd(&a, file.as_fd(), Duration::from_secs(5)),
            Err(WindowError::PeerClosed { .. })
        ));
    }

    #[test]
    fn a_plain_byte_is_not_a_window_message() {
        use std::io::Write;
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"W").unwrap();
        assert!(matches!(
            recv_fd(&b, Duration::from_secs(5)),
            Err(WindowError::NoFdReceived { .. })
        ));
    }

    #[test]
    fn trying_takes_what_arrived_and_never_waits() {
        let (a, b) = UnixStream::pair().unwrap();
        let started = Instant::now();
        assert!(try_recv_fd(&b).unwrap().is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        send_fd(&a, file.as_fd(), Duration::from_secs(5)).unwrap();
        let received = try_recv_fd(&b).unwrap().expect("the descriptor was sent");
        let stat = rustix::fs::fstat(&received).unwrap();
        assert_eq!(stat.st_ino, rustix::fs::fstat(&file).unwrap().st_ino);
        drop(a);
        assert!(matches!(
            try_recv_fd(&b),
            Err(WindowError::PeerClosed { .. })
        ));
    }
}
