//! Giving freed memory back to the OS.
//!
//! glibc's malloc keeps what a process frees for reuse: after a model's weights and KV pool are
//! freed, their pages often stay resident (the dynamic mmap threshold moves large buffers into
//! the heap, and each thread's arena keeps its free space). An app that loads and disposes
//! runtimes would see its RSS climb by a model's size per cycle although nothing leaks.
//! [`return_freed_memory`] asks malloc to release free pages after a runtime is disposed.

/// Releases the allocator's free pages to the OS (glibc: `malloc_trim(0)`, which walks every
/// arena). A no-op on other platforms, whose allocators return large blocks on their own.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only reorganises the allocator's own free lists; it has no
    // preconditions and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
