fn main() {
    sbx_cgroup::main()
}
