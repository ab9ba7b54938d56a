//! Stack room for threads that run untrusted work.
//!
//! A stack overflow is not a panic: no `catch_unwind` stops it, and it kills the process. The
//! code that recurses over untrusted input (llguidance compiling a schema or a grammar,
//! minijinja parsing and running a chat template, regex and tokenizer parsers) is bounded in
//! depth before it runs ([`crate::sampling::format_depth`], minijinja's own recursion limits,
//! the regex parsers' nesting limits), and it runs on threads whose stack holds the worst case
//! at those bounds with room to spare: [`UNTRUSTED_STACK`]. The tests measure that worst case
//! ([`peak_use`]) and fail when it no longer fits a quarter of the stack.
//!
//! A stack is reserved address space: pages are only backed by memory once touched, so a
//! thread that recurses a little costs what it uses.

/// Stack of every thread that compiles formats, renders templates or reads untrusted files.
pub const UNTRUSTED_STACK: usize = 64 << 20;

/// `std::thread::Builder` for a thread that runs untrusted work.
pub fn untrusted_thread(name: impl Into<String>) -> std::thread::Builder {
    std::thread::Builder::new().name(name.into()).stack_size(UNTRUSTED_STACK)
}

/// Bytes of stack `work` touched, run on a fresh thread with a `stack`-byte stack: the
/// distance from the top of that stack to the deepest byte written (the stack's pages start
/// zeroed, so the first nonzero byte from the bottom marks the deepest use).
#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
pub fn peak_use<T: Send>(stack: usize, work: impl FnOnce() -> T + Send) -> (T, usize) {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(stack)
            .spawn_scoped(s, move || {
                let out = work();
                // SAFETY: pthread_getattr_np fills `attr` for the calling thread; the range it
                // reports is this thread's mapped stack, read only below the current frame.
                let used = unsafe {
                    let mut attr: libc::pthread_attr_t = std::mem::zeroed();
                    assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
                    let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
                    assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
                    libc::pthread_attr_destroy(&mut attr);
                    let here = &out as *const T as usize;
                    let (low, high) = (addr as usize, addr as usize + size);
                    let words = (here - low) / 8;
                    let base = low as *const u64;
                    let first = (0..words).find(|&k| std::ptr::read_volatile(base.add(k)) != 0).unwrap_or(words);
                    high - (low + first * 8)
                };
                (out, used)
            })
            .expect("spawn")
            .join()
            .expect("the measured work panicked")
    })
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[inline(never)]
    fn recurse(n: usize) -> usize {
        let pad = std::hint::black_box([n as u8; 1024]);
        if n == 0 {
            pad[0] as usize
        } else {
            recurse(n - 1) + pad[1] as usize
        }
    }

    #[test]
    fn peak_use_sees_deeper_recursion() {
        let (_, shallow) = peak_use(8 << 20, || recurse(10));
        let (_, deep) = peak_use(8 << 20, || recurse(1000));
        assert!(deep > shallow + 900 * 1024, "shallow {shallow}, deep {deep}");
        assert!(deep < 8 << 20);
    }
}
