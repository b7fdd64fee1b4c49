fn main() {
    sbx_dnsproxy::main()
}
