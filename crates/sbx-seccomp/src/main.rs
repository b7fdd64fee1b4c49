fn main() {
    sbx_seccomp::main()
}
