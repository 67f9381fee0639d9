//! Writes the ledger's grant records off its lock. The ledger hands over a snapshot under its
//! lock (a clone of a small map); one writer thread writes the newest snapshot with the
//! state file's fsyncs, so no hook and no async worker waits on the disk, and an older snapshot
//! is never written after a newer one.

use super::state_file::{Records, StateFile, StateFileError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct Queue {
    /// The newest snapshot not yet written, with its number.
    latest: Option<(u64, Records)>,
    submitted: u64,
    written: u64,
    closing: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Saver {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Saver {
    /// Starts the writer thread for `file`; `on_error` reports a failed write (the next
    /// snapshot tries again).
    pub fn start(
        file: StateFile,
        on_error: impl Fn(StateFileError) + Send + 'static,
    ) -> std::io::Result<Saver> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tap-state-writer".into())
            .spawn(move || write_loop(&s, &file, on_error))?;
        Ok(Saver {
            shared,
            thread: Some(thread),
        })
    }

    /// Queues `records` to be written; a newer call replaces it if it is not written yet.
    pub fn submit(&self, records: Records) {
        let mut q = self.shared.lock();
        q.submitted += 1;
        q.latest = Some((q.submitted, records));
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Waits until everything submitted so far is written (or failed).
    pub fn flush(&self) {
        let mut q = self.shared.lock();
        let target = q.submitted;
        while q.written < target && !q.closing {
            q = self
                .shared
                .changed
                .wait(q)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn write_loop(s: &Shared, file: &StateFile, on_error: impl Fn(StateFileError)) {
    loop {
        let (n, records) = {
            let mut q = s.lock();
            loop {
                if let Some(job) = q.latest.take() {
                    break job;
                }
                if q.closing {
                    return;
                }
                q = s.changed.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        if let Err(e) = file.save(&records) {
            on_error(e);
        }
        s.lock().written = n;
        s.changed.notify_all();
    }
}

impl Drop for Saver {
    /// Writes what is queued, then stops the thread.
    fn drop(&mut self) {
        self.flush();
        self.shared.lock().closing = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_snapshot_is_what_ends_on_disk() {
        let dir = std::env::temp_dir().join(format!("tap-saver-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("grants.json");
        let saver = Saver::start(StateFile::new(path.clone()), |e| panic!("{e}")).unwrap();
        for i in 0..50 {
            let mut r = Records::new();
            r.insert("k".into(), format!("v{i}"));
            saver.submit(r);
        }
        saver.flush();
        let got = StateFile::new(path.clone()).load().unwrap();
        assert_eq!(got.get("k").map(String::as_str), Some("v49"));
        drop(saver);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
