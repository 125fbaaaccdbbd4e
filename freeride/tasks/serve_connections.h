// The connections of the `serve` task's HTTP server, between cpp-httplib's accept loop and its
// handlers. cpp-httplib 0.11 (Debian 12's) times each read of a request but not the whole of it,
// puts every accepted connection in its thread pool's unbounded queue, and tells neither the
// pool nor a handler which socket a job serves: a client that sends its headers a byte a
// second holds a thread for as long as it likes, and a burst waits in the queue behind them.
// ConnectionPool is the task queue the server is given instead (Server::new_task_queue):
// - It knows each job's socket. The accept loop hands over each connection right after
//   accepting it, and only it makes sockets whose local address is the listening socket's:
//   the one such socket not yet known (by inode, in /proc/self/fd) is the new connection.
// - A connection is taken by a free thread at once; when every thread is busy the accept loop
//   answers it 429 itself (a few hundred bytes into an empty send buffer: it never blocks)
//   and closes it. Nothing waits in a queue, and no burst is reset.
// - The whole request (line, headers, body) must arrive within `read_timeout_s` of a thread
//   taking the connection: a watchdog answers a slower one 408 and shuts its socket down both
//   ways, which ends the thread's read. The watchdog acts on a dup of the descriptor whose
//   inode it has checked, so a descriptor closed and reused meanwhile is never touched.
#pragma once

#include <httplib.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace freeride::serve {

class ConnectionPool : public httplib::TaskQueue {
 public:
  // `threads` serve connections; `listen_fd` is the server's listening socket; `on_refused` is
  // called for each connection answered 429 because every thread was busy.
  ConnectionPool(int threads, int listen_fd, double read_timeout_s,
                 std::function<void()> on_refused);
  ~ConnectionPool() override;

  // cpp-httplib's accept loop: `fn` serves and closes the connection just accepted.
  void enqueue(std::function<void()> fn) override;
  // After the accept loop ends: connections still reading a request are answered 503 and
  // closed, those in a handler finish, and the threads end.
  void shutdown() override;

  // In a handler, or where cpp-httplib answers an error itself (the request has been read):
  // the watchdog leaves this thread's connection alone from now on. Returns its socket (to
  // watch for the client hanging up), or -1 where the thread serves no known connection.
  static int EnterHandler();

 private:
  struct Connection {
    int fd = -1;
    ino_t inode = 0;
    double taken_s = 0;     // when a thread took it; 0: not yet (no deadline runs)
    bool answered = false;  // it reached a handler, or the watchdog answered it
  };
  struct Job {
    std::function<void()> fn;
    std::shared_ptr<Connection> connection;  // null: its socket could not be told
  };

  // The socket `fn` serves: the connected socket on the listening address not yet known.
  std::shared_ptr<Connection> Identify();
  void Work();
  void Watch();
  // Writes `response` to `c` and shuts it down both ways, if `c` is still the socket it was.
  static void Answer(const Connection& c, const std::string& response);
  // Answers 429 on a connection no thread can take, and closes it.
  void Refuse(const Connection& c);

  // The thread's connection while it serves one (a handler asks for it).
  static thread_local ConnectionPool* current_pool_;
  static thread_local std::shared_ptr<Connection> current_;

  const int threads_;
  const double read_timeout_s_;
  const std::function<void()> on_refused_;
  sockaddr_storage listen_address_{};
  std::mutex mu_;
  std::condition_variable work_, watch_;
  std::deque<Job> jobs_;
  int busy_ = 0;  // jobs queued or running
  bool stopping_ = false, workers_done_ = false;
  std::map<ino_t, std::shared_ptr<Connection>> connections_;  // served now, by inode
  // Sockets seen in the last scan that are not connections of ours: not looked at again. Only
  // the accept loop's thread (enqueue) uses it.
  std::set<ino_t> not_ours_;
  std::vector<std::thread> workers_;
  std::thread watchdog_;
};

// The raw HTTP/1.1 answer the pool sends by itself: `status` (408, 429 or 503) with OpenAI's
// error body as the handlers write them (`type` is its code too), closing the connection.
std::string RawErrorResponse(int status, const std::string& message, const std::string& type);

}  // namespace freeride::serve
