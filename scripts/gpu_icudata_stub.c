/* Stand-in for ICU 70's 29 MB data library (libicudata) in the trimmed tritonserver tree that the
   GPU check carries (scripts/gpu_pack.sh): it defines the one symbol libicuuc links against,
   with an empty, invalid data header. libicuuc is only there for libxml2, which the serving path
   never asks for a non-UTF-8 conversion; if it ever did, ICU would fail that call with
   U_INVALID_FORMAT_ERROR rather than crash. */
__attribute__((aligned(16))) const unsigned char icudt70_dat[32] = {0};
