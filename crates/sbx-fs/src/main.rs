fn main() {
    sbx_fs::main()
}
