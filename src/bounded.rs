//! Untrusted work on a thread of its own, under a memory and a time budget.
//!
//! Some work runs code that comes from a file we do not trust: a model's chat template is a
//! program, and a few instructions of it can double a string or a list until memory runs out
//! (`{% set ns.s = ns.s ~ ns.s %}` in a loop). An interpreter's instruction fuel cannot see
//! that, and an allocation that fails aborts the process. So such work runs through [`run`]:
//!
//! * on a new thread, while the caller waits for it with a deadline;
//! * with the bytes that thread holds counted by the process's global allocator ([`Metered`],
//!   a thin layer over the system allocator). An allocation that would take the thread past
//!   its budget, or any allocation after the deadline has passed, is never made: the thread
//!   reports that it stopped and parks for good, before the allocation, so it holds at most its
//!   budget, and the caller gets [`Exceeded`].
//!
//! A thread cannot be stopped from outside, and nothing may unwind out of an allocator, so
//! parking is the one way to stop it that neither aborts nor lets it run on. The cost of a
//! stop is that thread's memory (at most the budget) and its stack, kept for the life of the
//! process; callers make sure the same untrusted code is not run again afterwards (a chat
//! template that was stopped is refused from then on). Work that spins without allocating
//! after its deadline cannot be parked: the caller still gets [`Exceeded::Time`] at the
//! deadline, and the thread runs until it finishes or next allocates.
//!
//! Threads that are not running under [`run`] pay one relaxed atomic load per allocation while
//! no bounded thread exists, and one thread-local read while one does.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::{Duration, Instant};

/// The global allocator: the system allocator, with the allocations of bounded threads
/// counted against their budgets.
pub struct Metered;

/// Bounded threads started and not yet finished (a parked one stays counted).
static BOUNDED: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// The meter of the bounded thread this is, if it is one.
    static METER: Cell<*const Meter> = const { Cell::new(std::ptr::null()) };
}

/// Why a bounded thread was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// It tried to hold more than its memory budget.
    Memory { budget: usize },
    /// It had not finished by its deadline.
    Time { limit: Duration },
    /// No thread could be started for it.
    Spawn,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exceeded::Memory { budget } => write!(f, "it needed more than its {} MiB of memory", budget >> 20),
            Exceeded::Time { limit } => write!(f, "it did not finish within {} s", limit.as_secs_f64()),
            Exceeded::Spawn => f.write_str("no thread could be started for it"),
        }
    }
}

/// What a bounded thread may use.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes the thread may hold at once (what it allocates less what it frees of that).
    pub memory: usize,
    /// How long the caller waits for it.
    pub time: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Done,
    Stopped(Exceeded),
}

/// A bounded thread's account, shared with the caller waiting for it.
struct Meter {
    /// Bytes held; written only by the thread itself.
    held: AtomicIsize,
    budget: isize,
    limits: Limits,
    /// Set by the caller when the deadline passes: the next allocation stops the thread.
    late: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

impl Meter {
    fn finish(&self, state: State) {
        // std's Mutex and Condvar do not allocate here (and the meter is off by now).
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *s == State::Running {
            *s = state;
        }
        self.changed.notify_all();
    }
}

/// Counts `delta` bytes against the current thread's budget, if it has one; parks the thread
/// for good instead when that would exceed the budget or the deadline has passed.
#[inline]
fn charge(delta: isize) {
    if BOUNDED.load(Ordering::Relaxed) == 0 {
        return;
    }
    // `try_with`: a thread-local without a destructor is never torn down, but an allocator
    // must not panic whatever happens.
    let Ok(meter) = METER.try_with(Cell::get) else { return };
    if meter.is_null() {
        return;
    }
    // SAFETY: a non-null METER points into the `Arc<Meter>` the thread's own closure holds
    // (set by `run` and cleared before that Arc is dropped).
    let m = unsafe { &*meter };
    // Freeing what was allocated before the thread started earns it no credit.
    let held = m.held.load(Ordering::Relaxed).saturating_add(delta).max(0);
    m.held.store(held, Ordering::Relaxed);
    if delta > 0 {
        let over = if held > m.budget {
            Some(Exceeded::Memory { budget: m.limits.memory })
        } else if m.late.load(Ordering::Relaxed) {
            Some(Exceeded::Time { limit: m.limits.time })
        } else {
            None
        };
        if let Some(why) = over {
            stop(m, why);
        }
    }
}

/// Stops the current (bounded) thread for good: nothing after this point runs on it.
#[cold]
fn stop(m: &Meter, why: Exceeded) -> ! {
    // From here on the thread's allocations (if parking needed any) pass straight through.
    let _ = METER.try_with(|c| c.set(std::ptr::null()));
    m.finish(State::Stopped(why));
    loop {
        std::thread::park();
    }
}

// SAFETY: every method forwards to `System` with the same arguments; the bookkeeping around
// it neither allocates (while the meter is set) nor unwinds.
unsafe impl GlobalAlloc for Metered {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size() as isize);
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size() as isize);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        charge(-(layout.size() as isize));
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Sizes fit in an isize (a `Layout` guarantees it).
        charge(new_size as isize - layout.size() as isize);
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Clears the thread's meter when the work returns or unwinds.
struct Unmeter;

impl Drop for Unmeter {
    fn drop(&mut self) {
        let _ = METER.try_with(|c| c.set(std::ptr::null()));
        BOUNDED.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Turns the meter off on a bounded thread that panics, before the panic hook runs: the hook
/// takes process-wide locks (standard error, the backtrace) and allocates under them, and a
/// thread stopped there would hold them for good.
fn unmeter_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = METER.try_with(|c| c.set(std::ptr::null()));
            previous(info)
        }));
    });
}

/// Runs `work` on a new thread named `name` within `limits`, and waits for it. A panic in
/// `work` is returned as its message.
///
/// `work` must not allocate while it holds a lock that other threads take (a stop there would
/// hold that lock for good): its own locks are fine, and process-wide state it initialises on
/// first use should be initialised before (see the chat template's warm-up).
pub fn run<T: Send + 'static>(
    name: &str,
    limits: Limits,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<Result<T, String>, Exceeded> {
    let meter = Arc::new(Meter {
        held: AtomicIsize::new(0),
        budget: isize::try_from(limits.memory).unwrap_or(isize::MAX),
        limits,
        late: AtomicBool::new(false),
        state: Mutex::new(State::Running),
        changed: Condvar::new(),
    });
    unmeter_panics();
    let slot: Arc<Mutex<Option<Result<T, String>>>> = Arc::new(Mutex::new(None));
    let (m, out) = (meter.clone(), slot.clone());
    let spawned = crate::stack::untrusted_thread(name).spawn(move || {
        BOUNDED.fetch_add(1, Ordering::Relaxed);
        let unmeter = Unmeter;
        METER.with(|c| c.set(Arc::as_ptr(&m)));
        let result = catch_unwind(AssertUnwindSafe(work)).map_err(|p| crate::error::panic_message(&*p));
        drop(unmeter);
        *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        m.finish(State::Done);
    });
    let Ok(thread) = spawned else { return Err(Exceeded::Spawn) };
    let deadline = Instant::now() + limits.time;
    let mut state = meter.state.lock().unwrap_or_else(|p| p.into_inner());
    while *state == State::Running {
        let now = Instant::now();
        if now >= deadline {
            meter.late.store(true, Ordering::Relaxed);
            return Err(Exceeded::Time { limit: limits.time });
        }
        state = meter.changed.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
    }
    if let State::Stopped(why) = *state {
        return Err(why);
    }
    drop(state);
    // Done: the thread is returning. Joining it lets it finish its exit (thread-local
    // destructors) before the caller goes on, so a finished render leaves nothing behind.
    let _ = thread.join();
    let result = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    Ok(result.unwrap_or_else(|| Err("no result".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Limits = Limits { memory: 8 << 20, time: Duration::from_secs(20) };

    #[test]
    fn work_within_its_budget_returns_its_result() {
        let r = run("t", SMALL, || vec![7u8; 4 << 20].len()).unwrap().unwrap();
        assert_eq!(r, 4 << 20);
        // Memory allocated before and freed inside, or allocated inside and handed back, is
        // fine: the budget is about what the thread holds.
        let v = vec![1u8; 16 << 20];
        let back = run("t", SMALL, move || {
            drop(v);
            let mut s = String::new();
            for _ in 0..1000 {
                s = format!("{s}x");
            }
            s
        })
        .unwrap()
        .unwrap();
        assert_eq!(back.len(), 1000);
    }

    #[test]
    fn doubling_stops_at_the_budget() {
        let e = run("t", SMALL, || {
            let mut s = String::from("x");
            for _ in 0..64 {
                s = format!("{s}{s}");
            }
            s.len()
        })
        .unwrap_err();
        assert_eq!(e, Exceeded::Memory { budget: 8 << 20 });
        // Many small allocations add up the same way.
        let e = run("t", SMALL, || (0..10_000_000).map(|i| vec![i as u8; 64]).collect::<Vec<_>>().len()).unwrap_err();
        assert!(matches!(e, Exceeded::Memory { .. }), "{e:?}");
    }

    #[test]
    fn a_late_thread_is_stopped_at_its_next_allocation() {
        let limits = Limits { memory: 1 << 30, time: Duration::from_millis(200) };
        let t0 = Instant::now();
        let e = run("t", limits, || loop {
            std::hint::black_box(vec![0u8; 16]);
        })
        .unwrap_err();
        assert_eq!(e, Exceeded::Time { limit: Duration::from_millis(200) });
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_panic_is_returned_as_its_message() {
        let r = run("t", SMALL, || -> u32 { panic!("boom") }).unwrap();
        assert!(r.unwrap_err().contains("boom"));
    }

    #[test]
    fn other_threads_are_not_metered() {
        // A bounded thread stopped for good does not affect anyone else's allocations.
        let _ = run("t", Limits { memory: 1 << 20, time: SMALL.time }, || vec![0u8; 2 << 20].len()).unwrap_err();
        assert_eq!(vec![0u8; 64 << 20].len(), 64 << 20);
    }
}
