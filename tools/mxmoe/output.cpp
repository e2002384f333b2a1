// Output files named on the command line (--json, --dump): checked before the run, written through a
// temporary file (a temporary directory for --dump) in the same folder with every write and the
// close checked, renamed over the path only when complete. A failed write leaves the path as it was
// (or absent) and names the reason. One rule for both flags: the folder the output goes into must
// exist; mxmoe creates only the file or the dump directory itself, once the output is complete.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

namespace fs = std::filesystem;

std::string reason(int err) { return std::strerror(err); }

// The file a path names once symlinks are followed (a rename must replace the target, not the link).
std::string resolved(const std::string& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    const fs::path target = fs::weakly_canonical(path, ec);
    if (!ec) return target.string();
  }
  return path;
}

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// A fresh temporary name beside `path`: .NAME.tmp-PID-N
std::string temp_name(const std::string& path) {
  static std::atomic<int> counter{0};
  const fs::path p(path);
  std::string name = ".";  // appended, not operator+ on a literal: GCC 12 warns falsely (-Wrestrict)
  name += p.filename().string();
  name += ".tmp-";
  name += std::to_string(getpid());
  name += '-';
  name += std::to_string(counter++);
  return (p.parent_path() / name).string();
}

bool writes_in_place(const struct stat& st) { return S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode); }

// Creates (then removes) a file in `folder`: the only test that the run's outputs can be created
// there (permissions, read-only or pseudo file systems such as /proc).
void probe_folder(const std::string& flag, const std::string& path, const std::string& folder) {
  const std::string probe = temp_name((fs::path(folder) / fs::path(path).filename()).string());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw UsageError(flag + " " + path + ": cannot create a file in " + folder + ": " + reason(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

void check_output_file(const std::string& flag, const std::string& path_in) {
  if (path_in.empty()) throw UsageError(flag + " needs a file name");
  const std::string path = resolved(path_in);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw UsageError(flag + " " + path_in + ": is a directory");
    if (writes_in_place(st)) {
      if (::access(path.c_str(), W_OK) != 0)
        throw UsageError(flag + " " + path_in + ": cannot write: " + reason(errno));
      return;
    }
    if (!S_ISREG(st.st_mode)) throw UsageError(flag + " " + path_in + ": not a regular file");
  } else if (errno != ENOENT) {
    throw UsageError(flag + " " + path_in + ": " + reason(errno));
  }
  const std::string folder = folder_of(path);
  struct stat dir {};
  if (::stat(folder.c_str(), &dir) != 0)
    throw UsageError(flag + " " + path_in + ": folder " + folder + " does not exist (" + reason(errno) + ")");
  if (!S_ISDIR(dir.st_mode)) throw UsageError(flag + " " + path_in + ": " + folder + " is not a directory");
  probe_folder(flag, path_in, folder);
}

namespace {

// The dump directory as an absolute path without a trailing separator (rename() needs its name).
std::string dump_target(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) p = fs::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "out/" names "out"
  return p.string();
}

// What an earlier dump holds: problem.json and .npy files, nothing else.
bool is_dump_file(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  std::error_code ec;
  return e.is_regular_file(ec) && (name == "problem.json" || e.path().extension() == ".npy");
}

}  // namespace

void check_output_dir(const std::string& flag, const std::string& dir) {
  if (dir.empty()) throw UsageError(flag + " needs a directory name");
  const std::string target = dump_target(dir);
  const std::string parent = folder_of(target);
  std::error_code ec;
  const fs::file_status pst = fs::status(parent, ec);
  if (!fs::exists(pst))
    throw UsageError(flag + " " + dir + ": folder " + parent + " does not exist (create it first; mxmoe creates " +
                     "only the dump directory itself)");
  if (!fs::is_directory(pst)) throw UsageError(flag + " " + dir + ": " + parent + " is not a directory");
  const fs::file_status st = fs::status(target, ec);
  if (fs::exists(st) && !fs::is_directory(st)) throw UsageError(flag + " " + dir + ": exists and is not a directory");
  if (fs::exists(st)) {
    std::error_code read;
    for (const fs::directory_entry& e : fs::directory_iterator(target, read))
      if (!is_dump_file(e))
        throw UsageError(flag + " " + dir + ": holds " + e.path().filename().string() +
                         ", which is no part of an mxmoe dump (a dump replaces its directory whole); choose a new or " +
                         "empty directory");
    if (read) throw UsageError(flag + " " + dir + ": cannot read the directory: " + read.message());
  }
  probe_folder(flag, target, parent);  // the dump is made beside it, then renamed into place
}

void check_distinct_outputs(const std::string& json_path, const std::string& dump_dir) {
  if (json_path.empty() || dump_dir.empty()) return;
  const fs::path dump = dump_target(dump_dir);
  const fs::path json = dump_target(json_path);
  const auto [end, ignored] = std::mismatch(dump.begin(), dump.end(), json.begin(), json.end());
  if (end == dump.end())
    throw UsageError("--json " + json_path + ": is the --dump directory " + dump_dir +
                     " or inside it (the dump replaces that directory whole); write the report elsewhere");
}

OutputDir::OutputDir(std::string flag, const std::string& dir) : flag_(std::move(flag)), path_(dump_target(dir)) {
  temp_ = temp_name(path_);
  std::error_code ec;
  if (!fs::create_directory(temp_, ec)) {
    const std::string temp = temp_;
    temp_.clear();
    throw Error(flag_, "cannot create a directory in " + folder_of(path_) + " (" + temp + "): " +
                           (ec ? ec.message() : "it exists"));
  }
}

OutputDir::~OutputDir() {
  std::error_code ec;
  if (!temp_.empty()) fs::remove_all(temp_, ec);
}

std::string OutputDir::file(const std::string& name) const { return (fs::path(temp_) / name).string(); }

void OutputDir::commit() {
  // rename() replaces an absent or empty directory at once; an earlier dump is moved aside first
  // and removed once the new one is in place (moved back if that rename fails).
  if (::rename(temp_.c_str(), path_.c_str()) == 0) {
    temp_.clear();
    return;
  }
  if (errno != ENOTEMPTY && errno != EEXIST) throw Error(flag_, "cannot rename the finished dump onto " + path_ + ": " + reason(errno));
  const std::string old = temp_name(path_ + ".old");
  if (::rename(path_.c_str(), old.c_str()) != 0)
    throw Error(flag_, "cannot move the earlier dump " + path_ + " aside: " + reason(errno));
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::rename(old.c_str(), path_.c_str());
    throw Error(flag_, "cannot rename the finished dump onto " + path_ + ": " + reason(err));
  }
  temp_.clear();
  std::error_code ec;
  fs::remove_all(old, ec);
}

OutputFile::OutputFile(std::string flag, std::string path) : flag_(std::move(flag)), path_(resolved(path)) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && writes_in_place(st)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open", errno);
    return;
  }
  temp_ = temp_name(path_);
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int err = errno;
    temp_.clear();  // nothing to remove
    fail("cannot create a file in " + folder_of(path_), err);
  }
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void OutputFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  throw Error(flag_, what + " " + path_ + ": " + reason(err));
}

void OutputFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write", n < 0 ? errno : EIO);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void OutputFile::commit() {
  // fsync: a full or failing disk may only say so when the data reaches it. Devices and FIFOs
  // cannot be synced (EINVAL), which is no error.
  if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) fail("cannot write", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("cannot write", errno);
  if (temp_.empty()) return;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) fail("cannot rename the finished file onto", errno);
  temp_.clear();
}

void write_text_file(const std::string& flag, const std::string& path, const std::string& text) {
  OutputFile f(flag, path);
  f.write(text);
  f.commit();
}

}  // namespace mxmoe::cli
