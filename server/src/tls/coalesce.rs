//! One write per answer on an HTTP/2 connection.
//!
//! h2 (under hyper and tonic) keeps a DATA payload of 256 bytes or more out of its own buffer
//! and writes it chained behind the frames before it; until that write is done, it accepts no
//! other frame. A unary gRPC answer over 256 bytes (a resource is about 1.3 KiB) is HEADERS +
//! DATA, then the trailers: h2 flushes the first two to make room for the third, and every
//! answer costs two `writev` calls — on loopback each also runs the receiver's TCP stack and
//! wakes its reader. Measured on a follower serving reads at 64 clients: 2.0 `writev` per read,
//! the second always 10 bytes (the trailers).
//!
//! [`Coalesced`] wraps a gRPC server's connection: what h2 writes is copied into a buffer, and a
//! flush that follows a chained write (h2 hands a chained DATA payload over as a second slice)
//! is put off; the bytes leave at the next flush, before the next read, at shutdown, or once
//! the buffer holds [`HIGH_WATER`] bytes. For a unary answer that is one write for headers, data
//! and trailers. Any other flush writes at once (a small answer, a window update, a heartbeat's
//! answer are not held back). Writes of [`PASS_THROUGH`] bytes or more on an empty buffer are not
//! copied (a list answer's 16 KiB frames go out as before).
//!
//! Why nothing waits forever: h2 flushes for room (a chained frame must be written before the
//! next frame is queued) and then, in the same round of its connection task, flushes again when
//! it has nothing more to queue, so a put-off flush is followed by another flush. A put-off
//! flush also wakes the task, so even a round that ended after it (the last frame of a stream
//! was chained) is followed by one that flushes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held before writes go out without waiting for a flush.
pub const HIGH_WATER: usize = 64 * 1024;
/// A write at least this large on an empty buffer goes straight to the connection: copying it
/// would cost more than the write it could save (h2 sends a large answer in 16 KiB frames, each
/// one such write).
pub const PASS_THROUGH: usize = 16 * 1024;
/// A buffer that grew past this (a large answer) is given back once it is written out, so an
/// idle connection holds little.
const KEEP_CAPACITY: usize = 16 * 1024;

/// A connection whose writes are gathered until a flush (see the module documentation).
pub struct Coalesced<T> {
    io: T,
    /// Bytes accepted and not yet written; `buf[written..]` is what is left.
    buf: Vec<u8>,
    written: usize,
    /// The last write carried a chained payload (two slices or more): h2 may be flushing only
    /// to make room for more frames.
    chained: bool,
    /// A flush was put off: the next flush writes.
    deferred: bool,
}

impl<T> Coalesced<T> {
    pub fn new(io: T) -> Coalesced<T> {
        Coalesced {
            io,
            buf: Vec::new(),
            written: 0,
            chained: false,
            deferred: false,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.written
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Writes out everything held, then flushes the inner connection (TLS keeps records of its
    /// own until flushed).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = std::task::ready!(
                Pin::new(&mut self.io).poll_write(cx, &self.buf[self.written..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        self.written = 0;
        self.deferred = false;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self.pending() > 0 && self.pending() + total > HIGH_WATER {
            std::task::ready!(self.poll_drain(cx))?;
        }
        if self.pending() == 0 && total >= PASS_THROUGH {
            self.chained = false;
            return Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        }
        self.chained = bufs.iter().filter(|b| !b.is_empty()).count() >= 2;
        if self.written > 0 {
            self.buf.drain(..self.written);
            self.written = 0;
        }
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending() > 0 {
            // A write that cannot go on now has registered for the socket's write readiness
            // (the same task): read meanwhile; an error is the connection's end.
            if let Poll::Ready(Err(error)) = this.poll_drain(cx) {
                return Poll::Ready(Err(error));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_accept(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_accept(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending() == 0 {
            return Pin::new(&mut this.io).poll_flush(cx);
        }
        if this.chained && !this.deferred {
            this.deferred = true;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        this.poll_drain(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Coalesced<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    /// Records every write call; reads find nothing (Pending); `blocked` refuses writes.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        blocked: bool,
        shut: bool,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.blocked {
                return Poll::Pending;
            }
            self.get_mut().writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            if self.blocked {
                return Poll::Pending;
            }
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = all.len();
            self.get_mut().writes.push(all);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<CountingWaker>, Waker) {
        let count = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    fn write(io: &mut Coalesced<Recorder>, cx: &mut Context<'_>, bytes: &[u8]) {
        match Pin::new(io).poll_write_vectored(cx, &[io::IoSlice::new(bytes)]) {
            Poll::Ready(Ok(n)) => assert_eq!(n, bytes.len()),
            other => panic!("write not accepted: {other:?}"),
        }
    }

    /// A write as h2 makes it when a DATA payload is chained behind its buffer.
    fn write_chained(io: &mut Coalesced<Recorder>, cx: &mut Context<'_>, head: &[u8], data: &[u8]) {
        let slices = [io::IoSlice::new(head), io::IoSlice::new(data)];
        match Pin::new(io).poll_write_vectored(cx, &slices) {
            Poll::Ready(Ok(n)) => assert_eq!(n, head.len() + data.len()),
            other => panic!("write not accepted: {other:?}"),
        }
    }

    fn flush(io: &mut Coalesced<Recorder>, cx: &mut Context<'_>) {
        assert!(matches!(Pin::new(io).poll_flush(cx), Poll::Ready(Ok(()))));
    }

    #[test]
    fn an_answer_flushed_twice_leaves_in_one_write() {
        let (wakes, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut io = Coalesced::new(Recorder::default());
        // What h2 does for a unary answer: headers and chained data, a flush to make room, the
        // trailers, the flush that ends its round.
        write_chained(&mut io, &mut cx, b"headers", b"+data");
        flush(&mut io, &mut cx);
        assert!(io.get_ref().writes.is_empty(), "the first flush is put off");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "and wakes the task");
        write(&mut io, &mut cx, b"+trailers");
        flush(&mut io, &mut cx);
        assert_eq!(io.get_ref().writes, vec![b"headers+data+trailers".to_vec()]);
        assert_eq!(io.get_ref().flushes, 1);
        // Nothing held: a flush goes straight to the connection and does not wake.
        flush(&mut io, &mut cx);
        assert_eq!(io.get_ref().writes.len(), 1);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        // A small answer (no chained payload) is written at its flush, not held back.
        write(&mut io, &mut cx, b"small answer");
        flush(&mut io, &mut cx);
        assert_eq!(io.get_ref().writes[1], b"small answer".to_vec());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_read_or_a_shutdown_writes_what_a_put_off_flush_held() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut io = Coalesced::new(Recorder::default());
        write_chained(&mut io, &mut cx, b"ans", b"wer");
        flush(&mut io, &mut cx);
        assert!(io.get_ref().writes.is_empty(), "put off");
        let mut space = [0u8; 16];
        let mut buf = ReadBuf::new(&mut space);
        assert!(Pin::new(&mut io).poll_read(&mut cx, &mut buf).is_pending());
        assert_eq!(io.get_ref().writes, vec![b"answer".to_vec()]);

        write_chained(&mut io, &mut cx, b"go", b"away");
        flush(&mut io, &mut cx);
        assert!(matches!(
            Pin::new(&mut io).poll_shutdown(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(io.get_ref().writes.len(), 2);
        assert_eq!(io.get_ref().writes[1], b"goaway".to_vec());
        assert!(io.get_ref().shut);
    }

    #[test]
    fn large_writes_pass_through_and_a_full_buffer_goes_out_first() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut io = Coalesced::new(Recorder::default());
        let big = vec![7u8; PASS_THROUGH];
        write(&mut io, &mut cx, &big);
        assert_eq!(io.get_ref().writes.len(), 1, "not copied, written at once");

        let small = vec![2u8; 100];
        write(&mut io, &mut cx, &small);
        let part = vec![1u8; HIGH_WATER / 2];
        write(&mut io, &mut cx, &part);
        assert_eq!(io.get_ref().writes.len(), 1, "held behind what is held");
        write(&mut io, &mut cx, &part);
        assert_eq!(
            io.get_ref().writes.len(),
            3,
            "past the high water mark, the held went out first"
        );
        assert_eq!(io.get_ref().writes[1], [small, part.clone()].concat());
        assert_eq!(
            io.get_ref().writes[2],
            part,
            "then the large write, not copied"
        );
    }

    #[test]
    fn a_blocked_connection_refuses_more_than_it_can_hold() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut io = Coalesced::new(Recorder {
            blocked: true,
            ..Recorder::default()
        });
        let small = vec![2u8; 100];
        write(&mut io, &mut cx, &small);
        let part = vec![1u8; HIGH_WATER / 2];
        write(&mut io, &mut cx, &part);
        assert!(
            Pin::new(&mut io)
                .poll_write_vectored(&mut cx, &[io::IoSlice::new(&part)])
                .is_pending(),
            "the buffer is bounded: past the high water mark, writes wait for the socket"
        );
        assert!(
            Pin::new(&mut io).poll_flush(&mut cx).is_pending(),
            "a flush after a plain write writes, and waits for the socket"
        );
        io.io.blocked = false;
        flush(&mut io, &mut cx);
        assert_eq!(io.get_ref().writes, vec![[small, part].concat()]);
    }
}
