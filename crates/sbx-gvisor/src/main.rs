fn main() {
    sbx_gvisor::main()
}
