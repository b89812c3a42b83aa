#ifndef KPOOL_EXCEPTIONS_HPP
#define KPOOL_EXCEPTIONS_HPP

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace KPool {

/// Thrown by an entry point whose arguments break the contract, before
/// anything is launched: no output and no ring entry has been written.
/// what() reads
///   "KPool::<entry>: argument '<name>', row <r>: value <v> <problem>"
/// (", extent <i>" instead of a row for shape errors, nothing for scalars).
class InvalidArgument : public std::invalid_argument {
 public:
  InvalidArgument(std::string entry_point, std::string argument,
                  std::string where, std::int64_t row, std::string value,
                  std::string const& problem)
      : std::invalid_argument(compose(entry_point, argument, where, value,
                                      problem)),
        entry_point_(std::move(entry_point)),
        argument_(std::move(argument)),
        row_(row),
        value_(std::move(value)) {}

  /// "KPool::compress", "KPool::step", ...
  std::string const& entry_point() const noexcept { return entry_point_; }
  /// The argument's name as the entry point spells it.
  std::string const& argument() const noexcept { return argument_; }
  /// The offending row (index into the argument), or -1.
  std::int64_t row() const noexcept { return row_; }
  /// The offending value, printed.
  std::string const& value() const noexcept { return value_; }

 private:
  static std::string compose(std::string const& entry,
                             std::string const& argument,
                             std::string const& where,
                             std::string const& value,
                             std::string const& problem) {
    std::string s = entry + ": argument '" + argument + "'";
    if (!where.empty()) s += ", " + where;
    return s + ": value " + value + " " + problem;
  }

  std::string entry_point_;
  std::string argument_;
  std::int64_t row_;
  std::string value_;
};

}  // namespace KPool

#endif
