#include "core/checksum.h"

#include <string>

#include "core/files.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

TEST(ChecksumTest, Crc32cKnownAnswers) {
  EXPECT_EQ(Crc32c("", 0), 0u);
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  // 1280 bytes: the eight-byte loop and the byte tail (reference: a bitwise implementation).
  std::string bytes;
  for (int r = 0; r < 5; ++r) {
    for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  }
  EXPECT_EQ(Crc32c(bytes.data(), bytes.size()), 0x23B62C98u);
  // Extending a CRC piece by piece gives the CRC of the whole.
  EXPECT_EQ(Crc32c(bytes.data() + 3, bytes.size() - 3, Crc32c(bytes.data(), 3)),
            Crc32c(bytes.data(), bytes.size()));
  EXPECT_EQ(Crc32cHex(0xE3069283u), "e3069283");
}

TEST(ChecksumTest, FileChecksumAndErrors) {
  const std::string path = testing::TempDir() + "checksum_test.txt";
  ASSERT_TRUE(WriteFileAtomically(path, "123456789").ok());
  absl::StatusOr<FileChecksum> sum = ChecksumFile(path);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->bytes, 9);
  EXPECT_EQ(sum->crc32c, 0xE3069283u);
  EXPECT_EQ(ChecksumFile(path + ".absent").status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ChecksumFile("/dev/null").status().message().find("character device"),
            std::string::npos);
}

}  // namespace
}  // namespace freeride
